// The detail panel for one clicked request: the form that answered and why, how it ended, its
// plan (chosen knobs against the initial ones, predicted quality), predicted against actual
// time per stage, cuts, degraded flags, queue wait, worker and trace id. A request's record is final once listed, so the panel is drawn
// on selection only and stays put while the list moves on.

import { h } from './dom.js';
import { DASH, clock, compact, count, fixed, isNum, list, ms, num, pct, text } from './format.js';
import { formBadge, servedForm } from './form.js';
import { outcomeTone } from './outcome.js';
import { niceCeil } from './scale.js';
import { extentMs, msAxis, stageBars } from './stage-bars.js';

const KNOB_ORDER = ['passages', 'rerank_depth', 'retrieve_k'];
const TRACES_URL = '/v1/traces?limit=500';

async function copyText(value, source) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(value);
      return true;
    }
  } catch (err) {
    console.warn('dashboard: clipboard refused', err);
  }
  // Plain-http pages have no Clipboard API: select the text and use the legacy command.
  const range = document.createRange();
  range.selectNodeContents(source);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  try {
    return document.execCommand('copy');
  } catch {
    return false;
  }
}

function traceLine(request) {
  const code = h('code', { id: 'detail-trace-id' }, request.trace_id ?? '');
  const button = h('button', { type: 'button', class: 'copy', id: 'detail-copy' }, 'Copy');
  button.addEventListener('click', async () => {
    const ok = await copyText(code.textContent, code);
    button.textContent = ok ? 'Copied' : 'Select + Ctrl-C';
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  });
  return h('div', { class: 'trace-line' }, code, button,
    h('a', { href: TRACES_URL, target: '_blank', rel: 'noopener' }, 'recent traces'));
}

function facts(request) {
  const prompt = num(request.prompt_tokens, NaN);
  const cached = num(request.cached_tokens, NaN);
  const share = isNum(prompt) && prompt > 0 && isNum(cached) ? cached / prompt : null;
  const rows = [
    ['ended', clock(request.at)],
    ['tier', text(request.tier)],
    ['outcome', h('span', { class: 'badge', dataset: { tone: outcomeTone(request.outcome) } }, text(request.outcome))],
    ['TTFT / budget', h('span', { class: request.within_budget === false ? 'over' : '' },
      `${ms(request.ttft_ms)} / ${ms(request.budget_ms)}`)],
    ['within budget', request.within_budget === true ? 'yes' : request.within_budget === false ? 'no' : DASH],
    ['queue wait', ms(request.queue_wait_ms)],
    ['worker', text(request.worker)],
    ['prompt tokens', `${compact(request.prompt_tokens)} (cached ${compact(request.cached_tokens)}, ${pct(share, 0)})`],
    ['planner', request.planner === true ? 'on' : request.planner === false ? 'off (fixed knobs)' : DASH],
    ['predicted quality', fixed(request.quality, 3)],
  ];
  return h('dl', { class: 'facts' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

// A refusal has no form; a request from an older replica has none either.
function formFacts(request) {
  if (request.knobs === null || request.knobs === undefined) {
    return h('p', { class: 'empty' }, 'No form (refused before planning).');
  }
  const rows = [
    ['form', h('span', { id: 'detail-form' }, formBadge(servedForm(request)))],
    ['answer_mode asked', h('span', { id: 'detail-mode' }, text(request.mode))],
    ['why', h('span', { id: 'detail-form-reason' }, text(request.form_reason))],
    ['ended by', h('span', { id: 'detail-finish' }, text(request.finish_reason))],
    ['unsupported sentences', h('span', { id: 'detail-unsupported' }, count(request.unsupported_sentences))],
  ];
  return h('dl', { class: 'facts' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

function knobTable(request) {
  const knobs = request.knobs && typeof request.knobs === 'object' ? request.knobs : null;
  const initial = request.initial && typeof request.initial === 'object' ? request.initial : null;
  if (!knobs && !initial) return h('p', { class: 'empty' }, 'No plan (refused before planning).');
  const names = [...new Set([...KNOB_ORDER, ...Object.keys(initial ?? {}), ...Object.keys(knobs ?? {})])];
  return h('table', { class: 'knobs' },
    h('thead', {}, h('tr', {}, h('th', {}, 'knob'), h('th', {}, 'initial'), h('th', {}, 'chosen'))),
    h('tbody', {}, names.map((name) => {
      const before = initial?.[name];
      const after = knobs?.[name];
      const changed = before !== undefined && after !== undefined && before !== after;
      return h('tr', { class: changed ? 'changed' : '' },
        h('td', {}, name), h('td', {}, text(before)), h('td', {}, text(after)));
    })));
}

function stageTable(request) {
  const stages = list(request.stages);
  if (!stages.length) return h('p', { class: 'empty' }, 'No stages ran.');
  const total = (key) => stages.reduce((sum, st) => sum + num(st[key]), 0);
  const delta = (planned, actual) => {
    if (!isNum(planned) || !isNum(actual)) return h('td', {}, DASH);
    const d = actual - planned;
    return h('td', { class: d > 0 ? 'over' : d < 0 ? 'under' : '' }, `${d > 0 ? '+' : ''}${ms(d)}`);
  };
  const scale_ms = niceCeil(1.05 * extentMs(request), 100);
  return h('div', {},
    h('div', { class: 'detail-bars' }, stageBars(request, scale_ms, 28), msAxis(scale_ms, 2)),
    h('table', { class: 'stages' },
      h('thead', {}, h('tr', {}, h('th', {}, 'stage'), h('th', {}, 'predicted'),
        h('th', {}, 'actual'), h('th', {}, 'Δ'))),
      h('tbody', {}, stages.map((st) => h('tr', {},
        h('td', {}, text(st.stage)), h('td', {}, ms(st.planned_ms)), h('td', {}, ms(st.actual_ms)),
        delta(st.planned_ms, st.actual_ms)))),
      h('tfoot', {}, h('tr', {}, h('td', {}, 'total'), h('td', {}, ms(total('planned_ms'))),
        h('td', {}, ms(total('actual_ms'))), delta(total('planned_ms'), total('actual_ms'))))));
}

function cutList(request) {
  const cuts = list(request.cuts);
  if (!cuts.length) return h('p', { class: 'empty' }, 'No cuts.');
  return h('ul', { class: 'cuts' }, cuts.map((c) => h('li', {},
    h('strong', {}, text(c?.stage)), `: ${text(c?.reason)} (${text(c?.done)} of ${text(c?.planned)} done)`)));
}

function degradedFlags(request) {
  const flags = list(request.degraded);
  if (!flags.length) return h('p', { class: 'empty' }, 'Not degraded.');
  return h('ul', { class: 'chips' }, flags.map((f) => h('li', {}, String(f))));
}

export function createDetail(root, { onClose }) {
  function placeholder() {
    root.replaceChildren(h('p', { class: 'empty' }, 'Click a request to see its form, plan, stages and cuts.'));
    root.classList.remove('open');
    delete root.dataset.traceId;
  }
  placeholder();

  return {
    show(request) {
      const close = h('button', { type: 'button', class: 'close', title: 'Close', 'aria-label': 'Close' }, '×');
      close.addEventListener('click', () => { placeholder(); onClose(); });
      root.replaceChildren(
        h('header', {}, h('h3', {}, 'Request'), close),
        traceLine(request),
        facts(request),
        h('h4', {}, 'Answer form'), formFacts(request),
        h('h4', {}, 'Plan'), knobTable(request),
        h('h4', {}, 'Stages: predicted vs actual'), stageTable(request),
        h('h4', {}, 'Cuts'), cutList(request),
        h('h4', {}, 'Degraded'), degradedFlags(request),
      );
      root.classList.add('open');
      root.dataset.traceId = request.trace_id ?? '';
    },
  };
}
