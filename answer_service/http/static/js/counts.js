// Outcome counts as tiles. Known outcomes keep a fixed order and id; any other key the
// backend adds gets a tile after them.

import { h } from './dom.js';
import { count } from './format.js';

const TILES = [
  { key: 'answered', label: 'answered' },
  { key: 'ok', label: 'ok', tone: 'good' },
  { key: 'degraded', label: 'degraded', tone: 'warn' },
  { key: 'rejected', label: 'rejected', tone: 'bad' },
  { key: 'errored', label: 'errored', tone: 'bad' },
  { key: 'cancelled', label: 'cancelled', tone: 'warn' },
  { key: 'sources_only', label: 'sources only', tone: 'warn' },
];

function idFor(key) {
  return `count-${String(key).replace(/[^A-Za-z0-9]+/g, '-')}`;
}

export function createCounts(root) {
  const values = new Map();

  function tile({ key, label, tone }) {
    const value = h('span', { class: 'tile-value', id: idFor(key) }, '–');
    values.set(key, value);
    const node = h('div', { class: 'tile', dataset: { tone: tone ?? 'neutral' } },
      value, h('span', { class: 'tile-label' }, label));
    root.append(node);
    return value;
  }
  TILES.forEach(tile);

  return {
    render(snapshot) {
      const counts = snapshot.counts && typeof snapshot.counts === 'object' ? snapshot.counts : {};
      for (const key of Object.keys(counts)) {
        if (!values.has(key)) tile({ key, label: key.replace(/_/g, ' ') });
      }
      for (const [key, node] of values) {
        const n = counts[key];
        node.textContent = count(n);
        node.parentElement.classList.toggle('nonzero', typeof n === 'number' && n > 0);
      }
    },
  };
}
