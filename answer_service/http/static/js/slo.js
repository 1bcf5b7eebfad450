// SLO attainment: each rolling window as a big number, and the 10-second series as stacked
// bars (met below, missed above) so both the rate and the traffic behind it show. The snapshot
// carries no SLO target, so the numbers are not coloured good or bad.

import { xLabel, yGrid, frame } from './axes.js';
import { chartSvg, emptyNote, h, s } from './dom.js';
import { clock, count, isNum, list, num, pct } from './format.js';
import { integerTicks, linear, niceCeil } from './scale.js';

const FIXED_WINDOWS_S = [60, 300, 900];

function windowName(window_s) {
  return window_s % 60 === 0 ? `${window_s / 60} min` : `${window_s} s`;
}

function drawSeries(container, series) {
  const buckets = series.filter((b) => b && isNum(b.at));
  if (!buckets.some((b) => num(b.answered) > 0)) {
    container.replaceChildren(emptyNote('No answered requests in the last 15 minutes.'));
    return;
  }
  const { svg, width_px, height_px } = chartSvg(container, 150);
  const box = frame(width_px, height_px, { left: 32, right: 8, top: 8, bottom: 20 });
  const maxAnswered = niceCeil(Math.max(...buckets.map((b) => num(b.answered))), 1);
  const y = linear([0, maxAnswered], [box.bottom, box.top]);
  const band = (box.right - box.left) / buckets.length;
  const barW = Math.max(1, band * 0.8);
  svg.append(yGrid(box, integerTicks(maxAnswered, 4), y, String));

  buckets.forEach((b, i) => {
    const answered = num(b.answered);
    const met = Math.min(num(b.met), answered);
    if (answered <= 0) return;
    const x0 = box.left + i * band + (band - barW) / 2;
    const title = `${clock(b.at)}: ${met} of ${answered} met (${pct(met / answered, 0)})`;
    svg.append(
      s('rect', { class: 'bar bar-met', x: x0, width: barW, y: y(met), height: y(0) - y(met) },
        s('title', {}, title)),
      s('rect', { class: 'bar bar-missed', x: x0, width: barW, y: y(answered), height: y(met) - y(answered) },
        s('title', {}, title)),
    );
  });
  const first = buckets[0];
  const last = buckets[buckets.length - 1];
  svg.append(
    xLabel(box.left, height_px - 4, clock(first.at), 'start'),
    xLabel(box.right, height_px - 4, clock(last.at), 'end'),
  );
  container.replaceChildren(svg);
}

export function createSlo({ windowsEl, seriesEl }) {
  const cells = new Map();

  function cell(window_s) {
    const value = h('span', { class: 'big', id: `slo-${window_s}` }, '–');
    const detail = h('span', { class: 'sub' }, 'no data');
    windowsEl.append(h('div', { class: 'slo-window' },
      h('span', { class: 'label' }, `last ${windowName(window_s)}`), value, detail));
    cells.set(window_s, { value, detail });
  }
  FIXED_WINDOWS_S.forEach(cell);

  return {
    render(snapshot) {
      const slo = snapshot.slo && typeof snapshot.slo === 'object' ? snapshot.slo : {};
      const windows = new Map(list(slo.windows).filter((w) => w && isNum(w.window_s))
        .map((w) => [w.window_s, w]));
      for (const window_s of windows.keys()) if (!cells.has(window_s)) cell(window_s);
      for (const [window_s, { value, detail }] of cells) {
        const w = windows.get(window_s) ?? {};
        value.textContent = pct(w.attainment);
        detail.textContent = isNum(w.answered) ? `${count(w.met)} / ${count(w.answered)} met` : 'no data';
      }
      drawSeries(seriesEl, list(slo.series));
    },
  };
}
