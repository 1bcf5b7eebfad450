// How an outcome reads on the page. Anything that is not one of the pipeline's outcomes is
// a refusal code from admission (e.g. "overloaded").

const TONES = {
  ok: 'good',
  abstained: 'good',
  error: 'bad',
  cancelled: 'warn',
  sources_only: 'warn',
};

export function outcomeTone(outcome) {
  return TONES[outcome] ?? 'refused';
}

export function isRefusal(outcome) {
  return !(outcome in TONES);
}
