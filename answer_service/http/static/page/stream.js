// `POST /v1/answer` from the browser: fetch with a streamed body (EventSource cannot POST), the
// SSE frames parsed as they arrive. Aborting the signal closes the connection, and the service
// then aborts the request on SGLang.

export class HttpError extends Error {
  constructor(status, code, message, retryAfterS) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfterS = retryAfterS; // null when the response carried no Retry-After
  }
}

async function httpError(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch {
    /* not JSON: keep the status line */
  }
  const retry = Number.parseFloat(response.headers.get('Retry-After'));
  return new HttpError(response.status, code, message, Number.isFinite(retry) ? retry : null);
}

// One SSE frame ("event: x\ndata: {...}") as {event, data}; null for comments and keep-alives.
function parseFrame(frame) {
  let event = 'message';
  const data = [];
  for (const line of frame.split('\n')) {
    if (line.startsWith('event:')) event = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
  }
  return data.length ? { event, data: JSON.parse(data.join('\n')) } : null;
}

// Yields {event, data} in order; throws HttpError when the service refuses the request.
export async function* answerEvents(body, headers, signal) {
  const response = await fetch('/v1/answer', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream', ...headers },
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw await httpError(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const parsed = parseFrame(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (parsed) yield parsed;
    }
  }
}

// `GET /v1/passages/{id}`: the whole passage a citation points at.
export async function fetchPassage(passageId, headers) {
  const response = await fetch(`/v1/passages/${encodeURIComponent(passageId)}`, { headers });
  if (!response.ok) throw await httpError(response);
  return response.json();
}
