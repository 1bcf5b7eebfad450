// Linear scales and "nice" axis bounds for the SVG charts.

// The smallest 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten that is >= value (at least `floor`).
export function niceCeil(value, floor = 1) {
  const v = Math.max(value, floor);
  const power = 10 ** Math.floor(Math.log10(v));
  for (const step of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
    if (step * power >= v) return step * power;
  }
  return 10 * power;
}

// Maps [d0, d1] onto [r0, r1]; a zero-width domain maps everything to the middle.
export function linear([d0, d1], [r0, r1]) {
  const span = d1 - d0;
  if (span === 0) return () => (r0 + r1) / 2;
  return (x) => r0 + ((x - d0) / span) * (r1 - r0);
}

// `n` evenly spaced ticks from 0 to max inclusive (max is expected to be nice).
export function ticks(max, n = 4) {
  return Array.from({ length: n + 1 }, (_, i) => (max * i) / n);
}

// Integer ticks for small counts (passages, rerank depth): never fractional labels. The last
// tick is the first multiple of the step at or above max, so it can serve as the axis top.
export function integerTicks(max, n = 4) {
  const step = Math.max(1, Math.ceil(max / n));
  const out = [0];
  while (out[out.length - 1] < max) out.push(out[out.length - 1] + step);
  return out;
}
