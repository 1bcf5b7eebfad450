// The API key, entered once and kept in this browser's localStorage. The service takes it as
// `Authorization: Bearer <key>` (or `X-API-Key`; answer_service/http/access.py).

const STORAGE_KEY = 'answer-service.api-key';

export function storedKey() {
  try {
    return localStorage.getItem(STORAGE_KEY) || '';
  } catch {
    return ''; // storage turned off: the key lives only as long as the page
  }
}

export function storeKey(key) {
  try {
    if (key) localStorage.setItem(STORAGE_KEY, key);
    else localStorage.removeItem(STORAGE_KEY);
  } catch {
    /* storage turned off */
  }
}

export function authHeaders(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}
