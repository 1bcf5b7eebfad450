// Number and time formatting. Every function accepts null (the snapshot's "no data") and
// answers with a dash rather than "NaN" or "null".

export const DASH = '–';

export function isNum(value) {
  return typeof value === 'number' && Number.isFinite(value);
}

export function num(value, fallback = 0) {
  return isNum(value) ? value : fallback;
}

export function ms(value) {
  if (!isNum(value)) return DASH;
  if (value === 0) return '0 ms';
  if (Math.abs(value) >= 10000) return `${(value / 1000).toFixed(1)} s`;
  if (Math.abs(value) >= 1000) return `${(value / 1000).toFixed(2)} s`;
  if (Math.abs(value) >= 10) return `${Math.round(value)} ms`;
  return `${value.toFixed(1)} ms`;
}

export function pct(fraction, digits = 1) {
  return isNum(fraction) ? `${(fraction * 100).toFixed(digits)}%` : DASH;
}

export function count(value) {
  return isNum(value) ? String(Math.round(value)) : DASH;
}

export function compact(value) {
  if (!isNum(value)) return DASH;
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (abs >= 1e3) return `${(value / 1e3).toFixed(1)}k`;
  return String(Math.round(value));
}

export function fixed(value, digits = 2) {
  return isNum(value) ? value.toFixed(digits) : DASH;
}

function pad2(n) {
  return String(n).padStart(2, '0');
}

// Local wall-clock time of a unix-seconds timestamp.
export function clock(at_s) {
  if (!isNum(at_s)) return DASH;
  const d = new Date(at_s * 1000);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

export function text(value) {
  return value === null || value === undefined || value === '' ? DASH : String(value);
}

// Lists in the snapshot may be missing or null when a backend has nothing to report.
export function list(value) {
  return Array.isArray(value) ? value : [];
}
