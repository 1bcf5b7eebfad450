// TTFT p50 / p95 / p99 split three ways (tenant tier, prompt length, cache hit or miss), as
// horizontal grouped bars. The three charts share one millisecond axis so a bar on one can be
// compared with a bar on another. `drawGroups` also draws the TTFT split by form (ttft-served.js).

import { chartSvg, emptyNote, h, s } from './dom.js';
import { count, isNum, list, ms, num } from './format.js';
import { PERCENTILES } from './palette.js';
import { linear, niceCeil, ticks } from './scale.js';

const BAR_H = 8;
const BAR_GAP = 2;
const GROUP_GAP = 10;
const LABEL_W = 84;
const VALUE_W = 72;
const AXIS_H = 18;

export function groups(rows) {
  return list(rows).filter((r) => r && r.key !== undefined && r.key !== null);
}

export function drawGroups(container, rows, max_ms) {
  if (!rows.length || !rows.some((r) => PERCENTILES.some((p) => isNum(r[p.key])))) {
    container.replaceChildren(emptyNote('No TTFT samples yet.'));
    return;
  }
  const groupH = PERCENTILES.length * (BAR_H + BAR_GAP) + GROUP_GAP;
  const { svg, width_px } = chartSvg(container, rows.length * groupH + AXIS_H);
  const left = LABEL_W;
  const right = width_px - VALUE_W;
  const x = linear([0, max_ms], [left, right]);
  const plotBottom = rows.length * groupH;

  const grid = s('g', { class: 'grid' });
  for (const v of ticks(max_ms, 4)) {
    grid.append(
      s('line', { x1: x(v), x2: x(v), y1: 0, y2: plotBottom }),
      s('text', { x: x(v), y: plotBottom + 12, 'text-anchor': 'middle' }, ms(v)),
    );
  }
  svg.append(grid);

  rows.forEach((row, i) => {
    const top = i * groupH + GROUP_GAP / 2;
    svg.append(
      s('text', { class: 'group-label', x: 0, y: top + BAR_H }, String(row.key)),
      s('text', { class: 'group-count', x: 0, y: top + BAR_H * 2 + 6 }, `n=${count(row.count)}`),
    );
    PERCENTILES.forEach((p, j) => {
      const y = top + j * (BAR_H + BAR_GAP);
      const value = row[p.key];
      if (isNum(value)) {
        svg.append(s('rect', {
          class: `bar bar-${p.key}`, x: left, y, height: BAR_H,
          width: Math.max(1, x(value) - left), fill: p.colour,
        }, s('title', {}, `${row.key} ${p.key}: ${ms(value)} (n=${count(row.count)})`)));
      }
      svg.append(s('text', {
        class: 'bar-value', x: isNum(value) ? x(value) + 4 : left + 4, y: y + BAR_H - 1,
      }, `${p.key} ${ms(value)}`));
    });
  });
  container.replaceChildren(svg);
}

export function ttftLegend() {
  return h('ul', { class: 'legend' }, PERCENTILES.map((p) =>
    h('li', {}, h('i', { style: `background:${p.colour}` }), p.key)));
}

export function createTtft({ tierEl, promptEl, cacheEl }) {
  return {
    render(snapshot) {
      const ttft = snapshot.ttft && typeof snapshot.ttft === 'object' ? snapshot.ttft : {};
      const parts = [
        [tierEl, groups(ttft.by_tier)],
        [promptEl, groups(ttft.by_prompt_bucket)],
        [cacheEl, groups(ttft.by_cache)],
      ];
      const highest = Math.max(0, ...parts.flatMap(([, rows]) =>
        rows.flatMap((r) => PERCENTILES.map((p) => num(r[p.key])))));
      const max_ms = niceCeil(highest, 100);
      for (const [el, rows] of parts) drawGroups(el, rows, max_ms);
    },
  };
}
