// The latency-budget dashboard: wires each panel to the snapshot stream.
//
// Every panel is an object with `render(snapshot)`; a snapshot is drawn by handing it to each
// panel in turn. A panel that throws is reported on the console and the others still draw, so
// one bad field does not freeze the page. After each snapshot, `body[data-snapshots]` counts
// the snapshots drawn and `window.__lastSnapshot` holds the last one (for tests and debugging).

import { connectSnapshots } from './js/connection.js';
import { createCacheShare } from './js/cache-share.js';
import { createCounts } from './js/counts.js';
import { createDetail } from './js/detail.js';
import { createForms } from './js/forms.js';
import { createHeader } from './js/header.js';
import { createPlanner } from './js/planner.js';
import { createSlo } from './js/slo.js';
import { createTtft, ttftLegend } from './js/ttft.js';
import { createServedTtft } from './js/ttft-served.js';
import { createWaterfall } from './js/waterfall.js';

const EVENTS_URL = '/dashboard/events';
const SNAPSHOT_URL = '/dashboard/snapshot';

const byId = (id) => document.getElementById(id);

function main() {
  const header = createHeader({
    status: byId('status'),
    source: byId('source'),
    replicas: byId('replicas'),
    updated: byId('updated'),
  });
  let waterfall = null;
  const detail = createDetail(byId('detail'), { onClose: () => waterfall?.clearSelection() });
  waterfall = createWaterfall({
    listEl: byId('waterfall'),
    axisEl: byId('waterfall-axis'),
    legendEl: byId('waterfall-legend'),
    onSelect: (request) => detail.show(request),
  });
  byId('ttft-legend').replaceChildren(ttftLegend());
  byId('forms-ttft-legend').replaceChildren(ttftLegend());

  const panels = [
    header,
    createCounts(byId('counts')),
    waterfall,
    createSlo({ windowsEl: byId('slo-windows'), seriesEl: byId('slo-series') }),
    createTtft({ tierEl: byId('ttft-tier'), promptEl: byId('ttft-prompt'), cacheEl: byId('ttft-cache') }),
    createCacheShare(byId('cache-share')),
    createPlanner({ chartEl: byId('planner-chart'), legendEl: byId('planner-legend') }),
    createForms({
      mixEl: byId('forms-mix'),
      legendEl: byId('forms-legend'),
      modesEl: byId('forms-modes'),
      tilesEl: byId('forms-tiles'),
    }),
    createServedTtft({ modelEl: byId('ttft-model'), otherEl: byId('ttft-without-model') }),
  ];

  let rendered = 0;
  document.body.dataset.snapshots = '0';

  function render(snapshot) {
    for (const panel of panels) {
      try {
        panel.render(snapshot);
      } catch (err) {
        console.error('dashboard: a panel failed to draw', err);
      }
    }
    rendered += 1;
    window.__lastSnapshot = snapshot;
    document.body.dataset.snapshots = String(rendered);
  }

  connectSnapshots({
    eventsUrl: EVENTS_URL,
    snapshotUrl: SNAPSHOT_URL,
    onSnapshot: render,
    onStatus: (state) => header.setStatus(state),
  });
}

main();
