// The answer forms over the last 15 minutes: the mix as one bar cut into forms (quote, focused,
// passages, abstain, sources only, answer cache) with its legend, the answer_mode the requests
// asked for, and how model-served answers went wrong: repetition loops stopped, answers stopped
// at an unsupported sentence, unsupported sentences per answer and the share with any.

import { chartSvg, emptyNote, h, s } from './dom.js';
import { count, fixed, isNum, list, num, pct } from './format.js';
import { formName, formSwatch } from './form.js';
import { formColour } from './palette.js';
import { linear } from './scale.js';

const BAR_H = 22;

const TILES = [
  { key: 'generated', id: 'forms-generated', label: 'model-served', show: count },
  { key: 'repetition_stops', id: 'forms-repetition', label: 'repetition stops', tone: 'warn', show: count },
  { key: 'unsupported_stops', id: 'forms-unsupported-stops', label: 'unsupported stops', tone: 'warn', show: count },
  { key: 'unsupported_rate', id: 'forms-unsupported-rate', label: 'unsupported sentences / answer', tone: 'warn', show: (v) => fixed(v, 2) },
  { key: 'unsupported_answer_share', id: 'forms-unsupported-share', label: 'answers with unsupported', tone: 'warn', show: (v) => pct(v, 0) },
];

function drawMix(container, rows) {
  const total = rows.reduce((sum, r) => sum + num(r.count), 0);
  if (total <= 0) {
    container.replaceChildren(emptyNote('No answers in the last 15 minutes.'));
    return;
  }
  const { svg, width_px } = chartSvg(container, BAR_H);
  const x = linear([0, total], [0, width_px]);
  let before = 0;
  for (const row of rows) {
    const n = num(row.count);
    if (n <= 0) continue;
    svg.append(s('rect', {
      class: 'bar bar-form', 'data-form': row.form, x: x(before), y: 0, height: BAR_H,
      width: Math.max(1, x(before + n) - x(before)), fill: formColour(row.form),
    }, s('title', {}, `${formName(row.form)}: ${count(n)} of ${count(total)} answers (${pct(n / total, 0)})`)));
    before += n;
  }
  container.replaceChildren(svg);
}

function legend(rows) {
  return rows.map((row) => h('li', { dataset: { form: row.form } },
    formSwatch(row.form), `${formName(row.form)} `,
    h('strong', {}, count(row.count)), ` (${pct(row.share, 0)})`));
}

function modes(rows) {
  const asked = rows.filter((r) => num(r.count) > 0);
  if (!asked.length) return 'No answer_mode asked yet.';
  return `answer_mode asked: ${asked.map((r) => `${r.mode} ${count(r.count)}`).join(' · ')}`;
}

export function createForms({ mixEl, legendEl, modesEl, tilesEl }) {
  const values = new Map();
  for (const tile of TILES) {
    const value = h('span', { class: 'tile-value', id: tile.id }, '–');
    values.set(tile.key, value);
    tilesEl.append(h('div', { class: 'tile', dataset: { tone: tile.tone ?? 'neutral' } },
      value, h('span', { class: 'tile-label' }, tile.label)));
  }

  return {
    render(snapshot) {
      const forms = snapshot.forms && typeof snapshot.forms === 'object' ? snapshot.forms : {};
      const mix = list(forms.mix).filter((r) => r && typeof r.form === 'string');
      drawMix(mixEl, mix);
      legendEl.replaceChildren(...legend(mix));
      modesEl.textContent = modes(list(forms.modes).filter((r) => r && typeof r.mode === 'string'));
      for (const tile of TILES) {
        const node = values.get(tile.key);
        const v = forms[tile.key];
        node.textContent = tile.show(v);
        node.parentElement.classList.toggle('nonzero', isNum(v) && v > 0);
      }
    },
  };
}
