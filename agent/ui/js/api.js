// The JSON API, as the pages use it. The token lives in sessionStorage (this tab, until it
// closes) and goes only into the Authorization header: never into a URL, a cookie or a log.

const TOKEN = 'waymark.token';
const PRINCIPAL = 'waymark.principal';

export const session = {
  token: () => sessionStorage.getItem(TOKEN),
  principal: () => sessionStorage.getItem(PRINCIPAL),
  signIn(token, principal) {
    sessionStorage.setItem(TOKEN, token);
    sessionStorage.setItem(PRINCIPAL, principal);
  },
  signOut() {
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(PRINCIPAL);
  },
};

/** A refusal: the API's `{"error": {reason, field, message}}` with its status. */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const e = body?.error ?? {};
    super(e.message ?? fallback ?? `HTTP ${status}`);
    this.status = status;
    this.reason = e.reason ?? `http_${status}`;
    this.field = e.field ?? null;
    this.body = body;
  }
}

let unauthorized = () => {};

/** Called with the refusal when the API no longer accepts the session's token. */
export function onUnauthorized(f) {
  unauthorized = f;
}

/**
 * One request. Resolves to `{status, headers, body}` (JSON parsed; JSON lines as an array);
 * rejects with an `ApiError` for a refusal. A 401 — or a 403 on a read, which leaves the
 * pages nothing to show — signs out and returns to sign-in with the API's words; a 403 on a
 * write is the caller's to show. `token` overrides the session's (sign-in tries one).
 */
export async function request(path, { method = 'GET', body, signal, token } = {}) {
  const headers = { Accept: 'application/json' };
  const bearer = token ?? session.token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: 'omit',
    cache: 'no-store',
    // A follower redirects writes to the leader, another origin: the browser would drop
    // the token there and the policy refuses the fetch, so say so instead of following.
    redirect: 'manual',
  });
  if (r.type === 'opaqueredirect') {
    throw new ApiError(307, {
      error: {
        reason: 'not_leader',
        field: null,
        message: 'this member is not the leader and redirects this request; open the UI on the leader (its address is at the top of the page)',
      },
    });
  }
  const text = await r.text();
  const type = r.headers.get('Content-Type') ?? '';
  let parsed = text;
  if (type.startsWith('application/jsonl')) {
    parsed = text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  } else if (type.startsWith('application/json') && text) {
    parsed = JSON.parse(text);
  }
  if (!r.ok) {
    const err = new ApiError(r.status, typeof parsed === 'object' ? parsed : null, text.trim() || undefined);
    if (token === undefined && (r.status === 401 || (r.status === 403 && method === 'GET'))) unauthorized(err);
    throw err;
  }
  return { status: r.status, headers: r.headers, body: parsed };
}

/** Sleeps `ms`, or less when `signal` aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}

const INDEX = 'X-Waymark-Index';

/**
 * Follows a read with the API's blocking queries (docs/cli.md, "Blocking queries"): asks
 * once, then again with `?index=<X-Waymark-Index>&wait=…`, which the member holds until
 * what the route reads changes. `onData(body)` gets every answer; `onError(err)` every
 * failure, after which it waits and starts over. Stops when `signal` aborts.
 */
export async function follow(path, { signal, onData, onError, wait = '30s' }) {
  let index = 0;
  while (!signal.aborted) {
    const sep = path.includes('?') ? '&' : '?';
    const url = index > 0 ? `${path}${sep}index=${index}&wait=${wait}` : path;
    try {
      const r = await request(url, { signal });
      const next = Number(r.headers.get(INDEX)) || 0;
      // An index that went down (another member, a restart): start over, as Consul's do.
      index = next < index ? 0 : next;
      onData(r.body, index);
      // A member answers an index other than its own at once; never spin on that.
      await sleep(100, signal);
    } catch (err) {
      if (signal.aborted) return;
      onError?.(err);
      index = 0;
      if (err.status === 401 || err.status === 403) return;
      await sleep(2000, signal);
    }
  }
}

/** Asks `load()` now and every `ms`, until `signal` aborts; failures go to `onError`. */
export async function poll(load, ms, { signal, onError }) {
  while (!signal.aborted) {
    try {
      await load();
    } catch (err) {
      if (signal.aborted) return;
      onError?.(err);
      if (err.status === 401 || err.status === 403) return;
    }
    await sleep(ms, signal);
  }
}

/** A path with a query string of the non-empty entries of `params`. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.append(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** A path segment, escaped. */
export const seg = encodeURIComponent;
