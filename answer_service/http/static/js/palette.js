// Colours that mean the same thing on every panel: one per stage, one per tenant tier, one per
// answer form. Tiers are not a fixed set, so unknown ones take the next free colour and keep it
// for the life of the page.

const STAGE_COLOURS = {
  queue: '#9aa3ad',
  embed: '#4e79a7',
  search: '#59a14f',
  rerank: '#b07aa1',
  prompt: '#f28e2b',
  first_token: '#76b7b2',
};
const SPARE = ['#e15759', '#edc948', '#ff9da7', '#9c755f', '#bab0ac', '#86bcb6'];

const KNOWN_TIERS = { premium: '#7b4fd6', standard: '#2b8cbe', free: '#e6860f', batch: '#6b8e23' };
const TIER_SPARE = ['#d6457a', '#17a398', '#8c6d31', '#5b6ee1', '#a05195', '#3d9970'];
// Forms the model answered in are blues; the forms without the model are the warm and grey ones.
const KNOWN_FORMS = {
  quote: '#2ca25f',
  focused: '#6baed6',
  passages: '#2171b5',
  abstain: '#969696',
  sources_only: '#e6550d',
  cached: '#d4a017',
  unknown: '#cfc8c4',
};
const assignedTiers = new Map(Object.entries(KNOWN_TIERS));
const assignedForms = new Map(Object.entries(KNOWN_FORMS));
const assignedStages = new Map(Object.entries(STAGE_COLOURS));

function pick(map, spare, key) {
  const name = String(key ?? 'unknown');
  if (!map.has(name)) map.set(name, spare[(map.size) % spare.length]);
  return map.get(name);
}

export function stageColour(stage) {
  return pick(assignedStages, SPARE, stage);
}

export function tierColour(tier) {
  return pick(assignedTiers, TIER_SPARE, tier);
}

export function formColour(form) {
  return pick(assignedForms, SPARE, form || 'unknown');
}

// p50 / p95 / p99: one hue, darker for the tail.
export const PERCENTILES = [
  { key: 'p50', colour: '#9ecae1' },
  { key: 'p95', colour: '#4292c6' },
  { key: 'p99', colour: '#08519c' },
];
