// The request list, newest first: one row per request with its stage bars on an axis shared
// by all rows, so rows compare at a glance. Rows are kept by trace id and rebuilt only when
// the shared axis changes, so a click that lands during a redraw still finds its row.

import { h } from './dom.js';
import { formName, servedForm } from './form.js';
import { clock, list, ms, text } from './format.js';
import { outcomeTone } from './outcome.js';
import { formColour } from './palette.js';
import { niceCeil } from './scale.js';
import { extentMs, msAxis, stageBars, stageLegend } from './stage-bars.js';

const DEFAULT_STAGES = ['embed', 'search', 'rerank', 'prompt', 'first_token'];

function stageNames(requests) {
  const names = [...DEFAULT_STAGES];
  for (const request of requests) {
    for (const stage of list(request.stages)) {
      if (!names.includes(stage.stage)) names.push(stage.stage);
    }
  }
  return names;
}

// The service stopped these answers before the model ended them.
const STOPS = { repetition: '↻', unsupported: '!' };

function marks(request) {
  const out = [];
  if (request.knobs !== null && request.knobs !== undefined) {
    const form = servedForm(request);
    const why = request.form_reason ? `: ${request.form_reason}` : '';
    out.push(h('span', {
      class: 'mark mark-form', style: `color:${formColour(form)}`, dataset: { form },
      title: `form ${formName(form)}${why}`,
    }, '●'));
  }
  const stop = STOPS[request.finish_reason];
  if (stop) {
    out.push(h('span', { class: 'mark mark-stop', title: `stopped: ${request.finish_reason}` }, stop));
  }
  const degraded = list(request.degraded);
  const cuts = list(request.cuts);
  if (degraded.length) {
    out.push(h('span', { class: 'mark mark-degraded', title: `degraded: ${degraded.join(', ')}` }, 'D'));
  }
  if (cuts.length) {
    out.push(h('span', { class: 'mark mark-cut', title: `${cuts.length} cut(s)` }, '✂'));
  }
  return out;
}

function buildRow(request, scale_ms) {
  const within = request.within_budget;
  return h('li', {
    class: 'request-row',
    tabindex: 0,
    role: 'option',
    dataset: { traceId: request.trace_id ?? '' },
  },
  h('span', { class: 'cell-time' }, clock(request.at)),
  h('span', { class: 'cell-tier' }, text(request.tier)),
  h('span', { class: 'badge', dataset: { tone: outcomeTone(request.outcome) } }, text(request.outcome)),
  h('span', {
    class: `cell-ttft ${within === false ? 'over' : ''}`,
    title: `TTFT ${ms(request.ttft_ms)} of a ${ms(request.budget_ms)} budget`,
  }, ms(request.ttft_ms), h('small', {}, ` / ${ms(request.budget_ms)}`)),
  h('span', { class: 'cell-marks' }, marks(request)),
  h('span', { class: 'cell-bars' }, stageBars(request, scale_ms)));
}

export function createWaterfall({ listEl, axisEl, legendEl, onSelect }) {
  const rows = new Map(); // `${trace_id}|${scale_ms}` -> <li>
  let requestsById = new Map();
  let selectedId = null;
  let legendKey = '';

  function choose(row) {
    const id = row?.dataset.traceId;
    if (!id || !requestsById.has(id)) return;
    selectedId = id;
    markSelected();
    onSelect(requestsById.get(id));
  }
  listEl.addEventListener('click', (event) => choose(event.target.closest('.request-row')));
  listEl.addEventListener('keydown', (event) => {
    if (event.key !== 'Enter' && event.key !== ' ') return;
    event.preventDefault();
    choose(event.target.closest('.request-row'));
  });

  function markSelected() {
    for (const row of listEl.children) {
      const on = row.dataset.traceId === selectedId;
      row.classList.toggle('selected', on);
      row.setAttribute('aria-selected', String(on));
    }
  }

  return {
    clearSelection() {
      selectedId = null;
      markSelected();
    },
    render(snapshot) {
      const requests = list(snapshot.requests).filter((r) => r && typeof r.trace_id === 'string');
      requestsById = new Map(requests.map((r) => [r.trace_id, r]));
      const scale_ms = niceCeil(1.05 * Math.max(0, ...requests.map(extentMs)), 100);

      const names = stageNames(requests);
      if (names.join() !== legendKey) {
        legendKey = names.join();
        legendEl.replaceChildren(stageLegend(names));
      }
      axisEl.replaceChildren(msAxis(scale_ms));

      if (!requests.length) {
        rows.clear();
        listEl.replaceChildren(h('li', { class: 'empty' }, 'No requests yet.'));
        return;
      }
      const keep = new Set();
      const ordered = [];
      for (const request of requests) {
        const key = `${request.trace_id}|${scale_ms}`;
        if (keep.has(key)) continue; // a trace id listed twice is drawn once
        keep.add(key);
        if (!rows.has(key)) rows.set(key, buildRow(request, scale_ms));
        ordered.push(rows.get(key));
      }
      for (const key of rows.keys()) if (!keep.has(key)) rows.delete(key);
      const scrollTop = listEl.scrollTop;
      listEl.replaceChildren(...ordered);
      listEl.scrollTop = scrollTop;
      markSelected();
    },
  };
}
