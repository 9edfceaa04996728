// Talking to the server: the API key (asked for on a 401 and kept in this browser), the
// error message of a refused request, and the events of a streamed reply (SSE).

const KEY = 'strata.apiKey';

export class ApiError extends Error {}

let askKey = async () => null;
let declined = false;  // asked once and refused: not asked again until the page is reloaded

/** The page's way of asking for a key: resolves to the key, or null when the person declines. */
export function whenKeyNeeded(ask) { askKey = ask; }

/** fetch with the stored key; a 401 asks for a key and tries again; a refusal throws its message. */
export async function call(path, init = {}) {
  for (let why = null; ;) {
    const headers = new Headers(init.headers || {});
    const key = localStorage.getItem(KEY);
    if (key) headers.set('Authorization', `Bearer ${key}`);
    const res = await fetch(path, { ...init, headers });
    if (res.status !== 401) {
      if (!res.ok) throw new ApiError(await errorText(res));
      return res;
    }
    why = await errorText(res);
    const entered = !declined && await askKey(key ? `The key was refused: ${why}` : `This server asks for an API key: ${why}`);
    if (!entered) {
      declined = true;
      throw new ApiError(`${why} (reload the page to enter a key)`);
    }
    localStorage.setItem(KEY, entered);
  }
}

/** The message of an error body (OpenAI's {error: {message}}, Ollama's {error}), else the status. */
export async function errorText(res) {
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    const err = body.error ?? body.detail;
    if (typeof err === 'string') return err;
    if (err && err.message) return err.message;
  } catch { /* not JSON: the text itself */ }
  return text.trim() || `${res.status} ${res.statusText}`;
}

/** The data of each server-sent event of a response, as it arrives. */
export async function* sseData(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r/g, '');
    for (let end; (end = buf.indexOf('\n\n')) >= 0;) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart());
      if (data.length) yield data.join('\n');
    }
  }
}
