// The sources list: what the answer was made from, numbered as the answer cites them.

import { h } from '../js/dom.js';

export function renderSources(list, sources) {
  list.replaceChildren(...sources.map((source) => h('li', { value: source.number, dataset: { number: source.number } },
    h('span', { class: 'source-title' }, source.title || source.doc_id),
    source.url ? [' ', h('a', { href: source.url, target: '_blank', rel: 'noopener', class: 'source-url' }, source.url)] : null,
    h('p', { class: 'snippet' }, source.snippet),
  )));
}
