// How an answer form reads on the page: its name and its colour, as a legend entry or a badge.
// The forms are the pipeline's (quote, focused, passages, abstain, sources_only) and `cached`
// for an answer served whole from the answer cache; `unknown` for an older replica's request.

import { h } from './dom.js';
import { formColour } from './palette.js';

export const FORMS = ['quote', 'focused', 'passages', 'abstain', 'sources_only', 'cached'];
// The forms the model is asked for: their first token takes its seconds, the others' the
// service's milliseconds.
export const MODEL_FORMS = ['focused', 'passages'];

const NAMES = { sources_only: 'sources only', cached: 'answer cache' };

export function formName(form) {
  if (form === null || form === undefined || form === '') return 'unknown';
  return NAMES[form] ?? String(form);
}

// The form a request is shown with: the answer cache's when it came from there.
export function servedForm(request) {
  return request?.from_cache === true ? 'cached' : (request?.form || 'unknown');
}

export function formSwatch(form) {
  return h('i', { class: 'swatch', style: `background:${formColour(form)}` });
}

export function formBadge(form, attrs = {}) {
  return h('span', { class: 'badge form-badge', dataset: { form: String(form) }, ...attrs },
    formSwatch(form), formName(form));
}
