// The planner's choices over time: passages and rerank depth, each a pane of points coloured
// by tenant tier, with a step line per tier joining that tier's successive choices.

import { frame, xLabel, yGrid } from './axes.js';
import { chartSvg, emptyNote, h, s } from './dom.js';
import { clock, fixed, isNum, list, text } from './format.js';
import { tierColour } from './palette.js';
import { integerTicks, linear } from './scale.js';

const KNOBS = [
  { key: 'passages', label: 'passages' },
  { key: 'rerank_depth', label: 'rerank depth' },
];
const PANE_H = 96;
const PANE_GAP = 22;
const MARGIN = { left: 34, right: 10, top: 14, bottom: 20 };

function byTier(choices) {
  const tiers = new Map();
  for (const choice of choices) {
    const tier = String(choice.tier ?? 'unknown');
    if (!tiers.has(tier)) tiers.set(tier, []);
    tiers.get(tier).push(choice);
  }
  return tiers;
}

// Step-after path through (at, value) points already sorted by time.
function stepPath(points, x, y) {
  return points.map((p, i) => {
    const px = x(p.at).toFixed(1);
    const py = y(p.value).toFixed(1);
    return i === 0 ? `M${px},${py}` : `H${px}V${py}`;
  }).join('');
}

function pane(svg, { top, box, x, choices, tiers, knob }) {
  const values = choices.map((c) => c[knob.key]).filter(isNum);
  const yTicks = integerTicks(Math.max(1, ...values), 4);
  const y = linear([0, yTicks[yTicks.length - 1]], [top + PANE_H, top]);
  const paneBox = { ...box, top, bottom: top + PANE_H };
  svg.append(
    yGrid(paneBox, yTicks, y, String),
    s('text', { class: 'pane-title', x: box.left, y: top - 8 }, knob.label),
  );
  for (const [tier, rows] of tiers) {
    const points = rows.filter((c) => isNum(c[knob.key])).map((c) => ({ at: c.at, value: c[knob.key], c }));
    if (!points.length) continue;
    const colour = tierColour(tier);
    svg.append(s('path', { class: 'step', d: stepPath(points, x, y), stroke: colour }));
    for (const { at, value, c } of points) {
      svg.append(s('circle', { class: 'point', cx: x(at), cy: y(value), r: 2.5, fill: colour },
        s('title', {}, `${clock(at)} ${tier}: passages ${text(c.passages)}, rerank ${text(c.rerank_depth)}, ` +
          `retrieve_k ${text(c.retrieve_k)}, quality ${fixed(c.quality, 3)}`)));
    }
  }
}

export function createPlanner({ chartEl, legendEl }) {
  let legendKey = '';

  return {
    render(snapshot) {
      const choices = list(snapshot.planner)
        .filter((c) => c && isNum(c.at) && KNOBS.some((k) => isNum(c[k.key])))
        .sort((a, b) => a.at - b.at);
      const tiers = byTier(choices);
      const key = [...tiers.keys()].join();
      if (key !== legendKey) {
        legendKey = key;
        legendEl.replaceChildren(h('ul', { class: 'legend' }, [...tiers.keys()].map((tier) =>
          h('li', {}, h('i', { style: `background:${tierColour(tier)}` }), tier))));
      }
      if (!choices.length) {
        chartEl.replaceChildren(emptyNote('The planner has made no choices yet.'));
        return;
      }
      const height_px = MARGIN.top + KNOBS.length * PANE_H + (KNOBS.length - 1) * PANE_GAP + MARGIN.bottom;
      const { svg, width_px } = chartSvg(chartEl, height_px);
      const box = frame(width_px, height_px, MARGIN);
      const t0 = choices[0].at;
      const t1 = Math.max(choices[choices.length - 1].at, isNum(snapshot.generated_at) ? snapshot.generated_at : 0);
      const x = linear([t0, t1], [box.left, box.right]);
      KNOBS.forEach((knob, i) => {
        pane(svg, { top: box.top + i * (PANE_H + PANE_GAP), box, x, choices, tiers, knob });
      });
      const timeTicks = t1 > t0 ? [0, 1, 2, 3].map((i) => t0 + ((t1 - t0) * i) / 3) : [t0];
      timeTicks.forEach((t, i) => {
        const anchor = timeTicks.length === 1 ? 'middle' : i === 0 ? 'start' : i === timeTicks.length - 1 ? 'end' : 'middle';
        svg.append(xLabel(x(t), height_px - 4, clock(t), anchor));
      });
      chartEl.replaceChildren(svg);
    },
  };
}
