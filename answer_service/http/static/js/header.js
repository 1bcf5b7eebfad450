// The page header: connection status, data source, replicas and the last snapshot's time.

import { h } from './dom.js';
import { clock, isNum, list } from './format.js';

export function createHeader({ status, source, replicas, updated }) {
  let lastAt_s = null;

  function tickAge() {
    if (!isNum(lastAt_s)) {
      updated.textContent = 'no snapshot yet';
      return;
    }
    const age_s = Math.max(0, Date.now() / 1000 - lastAt_s);
    updated.textContent = `${clock(lastAt_s)} (${age_s < 2 ? 'now' : `${Math.round(age_s)} s ago`})`;
    updated.classList.toggle('stale', age_s > 5);
  }
  setInterval(tickAge, 1000);
  tickAge();

  return {
    setStatus(state) {
      status.textContent = state;
      status.dataset.state = state;
    },
    render(snapshot) {
      lastAt_s = isNum(snapshot.generated_at) ? snapshot.generated_at : null;
      tickAge();
      source.textContent = snapshot.source ?? 'unknown';
      source.dataset.source = snapshot.source ?? '';
      const names = list(snapshot.replicas);
      replicas.replaceChildren(
        ...(names.length ? names.map((r) => h('li', {}, String(r))) : [h('li', { class: 'empty' }, 'none')]),
      );
    },
  };
}
