// One request's stages drawn end to end on a shared millisecond axis: a thin faint lane for
// the planned slices above a solid lane for the time actually spent, both starting after the
// queue wait, and a vertical line at the budget. Used by the waterfall rows and the detail
// panel, so both read the same way.

import { h, s } from './dom.js';
import { isNum, list, ms, num } from './format.js';
import { stageColour } from './palette.js';
import { linear } from './scale.js';

const VIEW_W = 1000; // viewBox units; the <svg> stretches horizontally to its cell

// The end of the furthest thing a row draws, for choosing a shared axis. Callers add a little
// headroom so a budget line that ends the axis is not drawn on the edge.
export function extentMs(request) {
  const stages = list(request.stages);
  const queue_ms = num(request.queue_wait_ms);
  const planned_ms = stages.reduce((sum, st) => sum + num(st.planned_ms), 0);
  const actual_ms = stages.reduce((sum, st) => sum + num(st.actual_ms), 0);
  return Math.max(num(request.budget_ms), queue_ms + planned_ms, queue_ms + actual_ms,
    num(request.ttft_ms));
}

function segment(cls, x0, x1, y, height, colour, title) {
  return s('rect', {
    class: cls,
    x: x0.toFixed(1),
    y,
    width: Math.max(0, x1 - x0).toFixed(1),
    height,
    fill: colour,
  }, s('title', {}, title));
}

export function stageBars(request, scale_ms, height = 20) {
  const x = linear([0, scale_ms], [0, VIEW_W]);
  const clampX = (v) => Math.min(VIEW_W, Math.max(0, x(v)));
  const plannedY = 1;
  const plannedH = Math.round(height * 0.3);
  const actualY = plannedY + plannedH + 1;
  const actualH = height - actualY - 1;
  const svg = s('svg', {
    class: 'stage-bars',
    viewBox: `0 0 ${VIEW_W} ${height}`,
    preserveAspectRatio: 'none',
    height,
  });

  const queue_ms = num(request.queue_wait_ms);
  if (queue_ms > 0) {
    svg.append(segment('bar-queue', 0, clampX(queue_ms), actualY, actualH, stageColour('queue'),
      `queue wait: ${ms(queue_ms)}`));
  }
  let plannedAt = queue_ms;
  let actualAt = queue_ms;
  for (const stage of list(request.stages)) {
    const colour = stageColour(stage.stage);
    const planned = num(stage.planned_ms);
    const actual = num(stage.actual_ms);
    const title = `${stage.stage}: planned ${ms(stage.planned_ms)}, actual ${ms(stage.actual_ms)}`;
    svg.append(segment('bar-planned', clampX(plannedAt), clampX(plannedAt + planned), plannedY,
      plannedH, colour, title));
    svg.append(segment('bar-actual', clampX(actualAt), clampX(actualAt + actual), actualY,
      actualH, colour, title));
    plannedAt += planned;
    actualAt += actual;
  }
  if (isNum(request.budget_ms)) {
    const bx = clampX(request.budget_ms);
    svg.append(s('line', {
      class: 'budget-line', x1: bx, x2: bx, y1: 0, y2: height,
      'vector-effect': 'non-scaling-stroke',
    }, s('title', {}, `budget ${ms(request.budget_ms)}`)));
  }
  return svg;
}

// An HTML axis under or over a column of stage bars (HTML so the labels are not stretched).
export function msAxis(scale_ms, n = 4) {
  const axis = h('div', { class: 'ms-axis' });
  for (let i = 0; i <= n; i += 1) {
    const v = (scale_ms * i) / n;
    axis.append(h('span', { style: `left:${(100 * i) / n}%` }, ms(v)));
  }
  return axis;
}

export function stageLegend(names) {
  return h('ul', { class: 'legend' },
    ['queue', ...names].map((name) => h('li', {},
      h('i', { style: `background:${stageColour(name)}` }), name === 'queue' ? 'queue wait' : name)),
    h('li', {}, h('i', { class: 'legend-planned' }), 'planned (thin)'),
    h('li', {}, h('i', { class: 'legend-budget' }), 'budget'));
}
