// Where snapshots come from: one GET for the first paint, then the SSE stream.
//
// EventSource reconnects by itself after a dropped connection (readyState CONNECTING). It
// gives up for good (readyState CLOSED) when the server answers with an error status or a
// wrong content type; only then do we open a fresh one, after `reopen_after_ms`.

export const Status = Object.freeze({
  CONNECTING: 'connecting',
  LIVE: 'live',
  RECONNECTING: 'reconnecting',
  OFFLINE: 'offline',
});

function parse(data) {
  try {
    const value = JSON.parse(data);
    return value !== null && typeof value === 'object' ? value : null;
  } catch (err) {
    console.warn('dashboard: snapshot is not JSON', err);
    return null;
  }
}

export function connectSnapshots({
  eventsUrl,
  snapshotUrl,
  onSnapshot,
  onStatus,
  reopen_after_ms = 5000,
}) {
  let streamed = false; // once the stream has delivered, the one-off GET is stale
  let source = null;

  function open() {
    onStatus(source === null ? Status.CONNECTING : Status.RECONNECTING);
    source = new EventSource(eventsUrl);
    source.addEventListener('open', () => onStatus(Status.LIVE));
    source.addEventListener('snapshot', (event) => {
      const snapshot = parse(event.data);
      if (snapshot === null) return;
      streamed = true;
      onStatus(Status.LIVE);
      onSnapshot(snapshot);
    });
    source.addEventListener('error', () => {
      if (source.readyState === EventSource.CLOSED) {
        onStatus(Status.OFFLINE);
        setTimeout(open, reopen_after_ms);
      } else {
        onStatus(Status.RECONNECTING);
      }
    });
  }

  async function firstPaint() {
    try {
      const response = await fetch(snapshotUrl, { headers: { accept: 'application/json' } });
      if (!response.ok) return;
      const snapshot = parse(await response.text());
      if (snapshot !== null && !streamed) onSnapshot(snapshot);
    } catch (err) {
      console.warn('dashboard: first snapshot failed', err);
    }
  }

  firstPaint();
  open();
}
