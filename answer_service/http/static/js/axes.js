// Shared bits of the cartesian SVG charts: the plot frame and y gridlines with labels.

import { s } from './dom.js';

export function frame(width_px, height_px, margin) {
  return {
    left: margin.left,
    right: width_px - margin.right,
    top: margin.top,
    bottom: height_px - margin.bottom,
  };
}

// Horizontal gridlines at `values` (already scaled by `y`), labelled on the left.
export function yGrid(box, values, y, label) {
  return s('g', { class: 'grid' }, values.map((v) => [
    s('line', { x1: box.left, x2: box.right, y1: y(v), y2: y(v) }),
    s('text', { x: box.left - 4, y: y(v), 'text-anchor': 'end', 'dominant-baseline': 'middle' }, label(v)),
  ]));
}

export function xLabel(x, y, text, anchor = 'middle') {
  return s('text', { class: 'axis-label', x, y, 'text-anchor': anchor }, text);
}
