// TTFT of model-served answers (focused, passages, not from the cache: the model's seconds)
// beside the rest (quotes, abstentions, the answer cache: the service's milliseconds), each
// as all of them and then form by form. The two charts keep axes of their own: on one axis
// the quotes would be slivers beside the model's bars, and on one distribution their
// milliseconds would pull the model's percentiles down.

import { drawGroups, groups } from './ttft.js';
import { MODEL_FORMS, formName } from './form.js';
import { PERCENTILES } from './palette.js';
import { niceCeil } from './scale.js';
import { num } from './format.js';

function rowsFor(served, byForm, key, inForm) {
  const all = served.get(key);
  const forms = byForm.filter((r) => inForm(r.key)).map((r) => ({ ...r, key: formName(r.key) }));
  return all ? [{ ...all, key: 'all' }, ...forms] : forms;
}

function draw(el, rows, floor_ms) {
  const highest = Math.max(0, ...rows.flatMap((r) => PERCENTILES.map((p) => num(r[p.key]))));
  drawGroups(el, rows, niceCeil(highest, floor_ms));
}

export function createServedTtft({ modelEl, otherEl }) {
  return {
    render(snapshot) {
      const ttft = snapshot.ttft && typeof snapshot.ttft === 'object' ? snapshot.ttft : {};
      const served = new Map(groups(ttft.by_served).map((r) => [r.key, r]));
      const byForm = groups(ttft.by_form);
      const known = (key) => key !== 'unknown';
      draw(modelEl, rowsFor(served, byForm, 'model', (k) => MODEL_FORMS.includes(k)), 100);
      draw(otherEl, rowsFor(served, byForm, 'without model',
        (k) => known(k) && !MODEL_FORMS.includes(k)), 10);
    },
  };
}
