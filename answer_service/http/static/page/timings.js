// Each stage's time against the budget: the `plan` event's budget and predictions, the `done`
// event's measured stages and time to first token, as a waterfall on the budget's scale.

import { h } from '../js/dom.js';
import { ms } from '../js/format.js';

const BEFORE_FIRST_TOKEN = ['embed', 'search', 'rerank', 'sentences', 'read', 'prompt'];

function bar(start_ms, width_ms, scale_ms, cls) {
  const left = (100 * start_ms) / scale_ms;
  const width = Math.max(0.4, (100 * width_ms) / scale_ms);
  return h('span', { class: `bar ${cls}`, style: `left:${left}%;width:${width}%` });
}

function row(name, actual_ms, predicted_ms, start_ms, scale_ms, budgetLine) {
  return h('tr', { dataset: { stage: name } },
    h('th', { scope: 'row' }, name),
    h('td', { class: 'num' }, ms(actual_ms)),
    h('td', { class: 'num muted' }, predicted_ms === null ? '' : ms(predicted_ms)),
    h('td', { class: 'track' }, bar(start_ms, actual_ms, scale_ms, 'actual'), budgetLine.cloneNode()),
  );
}

// `plan` alone (before `done`): the budget and the predictions; with `done`, the measured times.
export function renderTimings(container, plan, done) {
  const budget_ms = done ? done.ttft_budget_ms : plan ? plan.budget_ms : null;
  if (!budget_ms) {
    container.replaceChildren();
    return;
  }
  const predicted = plan ? plan.predicted_ms : {};
  const measured = done ? done.timings_ms : plan ? plan.actual_ms : {};
  const stages = BEFORE_FIRST_TOKEN.map((name) => [name, measured[name] || 0]);
  const before_ms = stages.reduce((sum, [, value]) => sum + value, 0);
  const ttft_ms = done && done.ttft_ms !== null ? done.ttft_ms : null;
  if (ttft_ms !== null) stages.push(['first token', Math.max(0, ttft_ms - before_ms)]);
  const scale_ms = Math.max(budget_ms, ttft_ms || 0, before_ms) * 1.05;
  const budgetLine = h('span', { class: 'budget-line', style: `left:${(100 * budget_ms) / scale_ms}%` });
  const rows = [];
  let start_ms = 0;
  for (const [name, value] of stages) {
    const key = name === 'first token' ? 'first_token' : name;
    const guess = key in predicted ? predicted[key] : null;
    rows.push(row(name, value, guess, start_ms, scale_ms, budgetLine));
    start_ms += value;
  }
  const verdict = !done ? 'running'
    : ttft_ms === null ? `no first token (${done.outcome})`
    : done.within_budget ? 'within budget' : 'over budget';
  container.replaceChildren(
    h('p', { class: 'ttft', dataset: { within: done ? String(done.within_budget) : 'pending' } },
      h('strong', {}, `first token ${ms(ttft_ms)}`), ` of a ${ms(budget_ms)} budget · `,
      h('span', { class: 'verdict' }, verdict),
      done ? ` · form ${done.form}` : plan ? ` · planned form ${plan.form}` : ''),
    h('table', {},
      h('thead', {}, h('tr', {},
        h('th', {}, 'stage'), h('th', { class: 'num' }, 'took'), h('th', { class: 'num' }, 'planned'),
        h('th', { class: 'track' }, h('span', { class: 'budget-label' }, 'budget ▾')))),
      h('tbody', {}, rows)),
    done ? h('p', { class: 'muted' },
      `then ${ms(done.timings_ms.generate)} streaming the rest · ${done.completion_tokens} tokens · `
      + `trace ${done.trace_id}`) : '',
  );
}
