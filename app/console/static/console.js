// The toolgate console: pages for approvers and auditors over the public API.
//
// Rules this file keeps:
// - The bearer token lives in sessionStorage only (from the organisation's sign-in, the
//   sign-in form or the address's #token=… fragment, which is removed at once); it is sent
//   only in the Authorization header, to this origin.
// - Sign-in with the OpenID provider (when toolgate has one): the authorization-code flow
//   with PKCE (S256), state and nonce, as a public client. The code leaves the address as
//   soon as the page reads it, and is redeemed once, for an ID token that toolgate verifies
//   on every call; the page goes back only to a console page it started from.
// - Every value from the API reaches the page as text (textContent, never innerHTML), so a
//   tool argument holding markup or script is shown, never run; an invisible character in it
//   (a bidi override, a zero-width space) is shown as a visible marker, never applied.
// - An approval names the snapshot hash of the preview this page showed; if the call was
//   previewed again meanwhile, toolgate refuses it and the page says so.
// - Endorsement is shown by argument and source, with toolgate's reason when nothing
//   endorses a value; the page never repeats a value in it.

const TOKEN_KEY = "toolgate.token";
const SIGNIN_KEY = "toolgate.signin"; // {state, nonce, verifier, returnTo} while the provider has the tab
const EXPIRED_KEY = "toolgate.expired"; // the page to return to after a session ran out
const REFRESH_MS = 5000;
const main = document.getElementById("main");

// ---- the token ---------------------------------------------------------------------------

function takeTokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token.trim());
    history.replaceState(null, "", location.pathname);
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** The token's claims, for showing who is signed in; toolgate verifies it on every call. */
function claims(value) {
  try {
    const part = value.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part));
  } catch {
    return {};
  }
}

// ---- the API -----------------------------------------------------------------------------

class Problem extends Error {
  constructor(status, body) {
    super((body && (body.detail || body.title)) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.body = body || {};
  }
}

async function api(path, options = {}) {
  const headers = { authorization: `Bearer ${token()}` };
  if (options.body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.setItem(EXPIRED_KEY, returnPath(location.pathname));
    render();
    throw new Problem(401, { detail: "your token was refused; sign in again" });
  }
  if (options.raw && response.ok) return response;
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = { detail: text };
  }
  if (!response.ok) throw new Problem(response.status, body);
  return body;
}

// ---- building the page (text only) -------------------------------------------------------

/** An element; string children become text nodes, so nothing from the API is ever parsed. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    if (child instanceof Node) node.append(child);
    else node.append(...visible(String(child)));
  }
  return node;
}

// Characters a reader cannot see or that reorder the text after them: bidi controls,
// zero-width and other default-ignorable characters, line separators, control characters
// (tab and line breaks aside).
const INVISIBLE = /([\p{Default_Ignorable_Code_Point}\p{Cf}\p{Zl}\p{Zp}\0-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f])/u;

/** ``text`` as text nodes, each invisible character in it shown as a marker ("U+202E"):
 * the approver sees every character of what they approve, in the order it is stored. */
function visible(text) {
  if (!INVISIBLE.test(text)) return [text];
  return text
    .split(INVISIBLE)
    .map((part, i) => (i % 2 ? marker(part) : part))
    .filter((part) => part !== "");
}

function marker(character) {
  const code = character.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
  return el("span", { class: "invisible", title: "an invisible character" }, `U+${code}`);
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

function target(value) {
  return value ? `${value.type} ${value.id}` : "—";
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

function age(iso) {
  return duration((Date.now() - new Date(iso).getTime()) / 1000);
}

function remaining(iso) {
  if (!iso) return "—";
  const left = (new Date(iso).getTime() - Date.now()) / 1000;
  return left <= 0 ? "expired" : `in ${duration(left)}`;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function problemBox(error, extra) {
  return el(
    "div",
    { class: "problem", role: "alert" },
    el("strong", {}, error.code || "error"),
    " ",
    error.message,
    extra,
  );
}

function table(headings, rows, empty) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}

// ---- sign-in -----------------------------------------------------------------------------

let provider; // undefined: not asked yet; null: toolgate has none; else how to sign in

async function signInProvider() {
  if (provider === undefined) {
    const response = await fetch("/console/config", { cache: "no-store", credentials: "omit" });
    if (!response.ok) throw new Problem(response.status, await response.json().catch(() => null));
    provider = (await response.json()).oidc;
  }
  return provider;
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function randomText(length) {
  return base64url(crypto.getRandomValues(new Uint8Array(length)));
}

async function s256(text) {
  return base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text))));
}

function redirectUri() {
  return `${location.origin}/console/callback`;
}

/** A console page to come back to: never another site, never the callback itself. */
function returnPath(path) {
  const page = /^\/console(\/audit|\/calls\/[A-Za-z0-9_-]+)?$/;
  return page.test(path) ? path : "/console";
}

async function startSignIn(oidc, returnTo) {
  const pending = { state: randomText(32), nonce: randomText(32), verifier: randomText(48), returnTo: returnPath(returnTo) };
  sessionStorage.setItem(SIGNIN_KEY, JSON.stringify(pending));
  const url = new URL(oidc.authorization_endpoint);
  for (const [name, value] of Object.entries({
    response_type: "code",
    client_id: oidc.client_id,
    redirect_uri: redirectUri(),
    scope: "openid",
    state: pending.state,
    nonce: pending.nonce,
    code_challenge: await s256(pending.verifier),
    code_challenge_method: "S256",
  })) {
    url.searchParams.set(name, value);
  }
  location.assign(url.toString());
}

/** Back from the provider (/console/callback): redeem the code for the sign-in this tab
 * started, or refuse; either way the code leaves the address first. */
async function finishSignIn() {
  const answer = new URLSearchParams(location.search);
  history.replaceState(null, "", "/console/callback");
  const pending = JSON.parse(sessionStorage.getItem(SIGNIN_KEY) || "null");
  sessionStorage.removeItem(SIGNIN_KEY);
  const refuse = (why) => {
    throw Object.assign(new Error(why), { code: "sign-in refused" });
  };
  if (!pending || !answer.get("state") || answer.get("state") !== pending.state) {
    refuse("this answer is not for a sign-in this tab started (its state differs). Sign in again.");
  }
  if (answer.get("error")) refuse(`the provider answered ${answer.get("error")}. Sign in again.`);
  const oidc = await signInProvider();
  if (!oidc || !answer.get("code")) refuse("the provider's answer holds no code.");
  const response = await fetch(oidc.token_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      code: answer.get("code"),
      redirect_uri: redirectUri(),
      client_id: oidc.client_id,
      code_verifier: pending.verifier,
    }),
    cache: "no-store",
    credentials: "omit",
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok || typeof body.id_token !== "string") {
    refuse(`the provider gave no token (${body.error || response.status}).`);
  }
  const c = claims(body.id_token);
  const audience = Array.isArray(c.aud) ? c.aud : [c.aud];
  if (c.nonce !== pending.nonce || c.iss !== oidc.issuer || !audience.includes(oidc.client_id)) {
    refuse("the token is not for this sign-in (its nonce, issuer or audience differs).");
  }
  sessionStorage.setItem(TOKEN_KEY, body.id_token);
  sessionStorage.removeItem(EXPIRED_KEY);
  history.replaceState(null, "", pending.returnTo);
}

async function signIn(notice) {
  const returnTo = sessionStorage.getItem(EXPIRED_KEY) || location.pathname;
  let oidc = null;
  try {
    oidc = await signInProvider();
  } catch (error) {
    notice = notice || problemBox(Object.assign(error, { code: "sign-in unavailable" }));
  }
  const expired = sessionStorage.getItem(EXPIRED_KEY)
    ? el("p", { class: "problem", role: "alert", id: "expired" }, "Your session has ended (the token expired or was refused). Sign in again to go back to the page you were on.")
    : null;
  const organisation = oidc
    ? el(
        "div",
        { class: "card" },
        el("h1", {}, "Sign in"),
        expired,
        notice || null,
        el("p", {}, "Sign in with your organisation's account. toolgate keeps the token it gets in this browser tab only."),
        el("button", { type: "button", id: "sign-in-oidc", onclick: () => startSignIn(oidc, returnTo) }, "Sign in with your organisation"),
      )
    : null;
  pasteToken(organisation ? null : [expired, notice || null], organisation);
}

function pasteToken(notices, before) {
  const input = el("textarea", {
    id: "token",
    rows: 4,
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "eyJhbGciOi…",
  });
  const form = el(
    "form",
    {
      class: "card",
      onsubmit: (event) => {
        event.preventDefault();
        const value = input.value.trim().replace(/^Bearer\s+/i, "");
        if (!value) return;
        sessionStorage.setItem(TOKEN_KEY, value);
        render();
      },
    },
    el("h1", {}, before ? "Or use a token" : "Sign in"),
    notices,
    el(
      "p",
      {},
      "Paste your own bearer token. It stays in this browser tab (session storage) and is ",
      "sent only to this server, in the Authorization header.",
    ),
    el("label", { for: "token" }, "Bearer token"),
    input,
    el("button", { type: "submit", id: "sign-in" }, "Sign in"),
  );
  show(...[before, form].filter(Boolean));
  if (!before) input.focus();
}

// ---- the approver's inbox ----------------------------------------------------------------

let refreshTimer = null;

async function inboxPage() {
  const body = el("div", {}, el("p", { class: "muted" }, "Loading…"));
  const stamp = el("span", { class: "muted", id: "updated" });
  show(el("section", {}, el("h1", {}, "Waiting for your decision ", stamp), body));
  const load = async () => {
    try {
      const page = await api("/approvals?status=pending");
      body.replaceChildren(inboxTable(page.items));
      stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      body.replaceChildren(problemBox(error));
    }
  };
  await load();
  refreshTimer = setInterval(load, REFRESH_MS);
}

function inboxTable(items) {
  const rows = items.map((item) =>
    el(
      "tr",
      { "data-call-id": item.call_id },
      el(
        "td",
        {},
        el("a", { href: `/console/calls/${encodeURIComponent(item.call_id)}` }, item.tool),
        unendorsed(item.endorsement).map((found) =>
          el("span", { class: "badge", title: found.reason || "" }, `${found.argument} unendorsed`),
        ),
        warnings(item.snapshot).length ? el("span", { class: "badge alarm" }, "warning") : null,
        quorum(item.approvals) ? el("span", { class: "badge quorum" }, `${item.approvals} approvals`) : null,
      ),
      el("td", {}, item.actor),
      el("td", {}, target(item.target)),
      el(
        "td",
        { class: "summary" },
        Object.entries(item.summary || {}).map(([name, value]) =>
          el("span", { class: "pair" }, `${name} `, el("strong", {}, shown(value))),
        ),
      ),
      el("td", {}, el("span", { class: `impact ${item.impact}` }, item.impact)),
      el("td", {}, age(item.requested_at)),
      el("td", {}, remaining(item.expires_at)),
    ),
  );
  return table(
    ["Tool", "Actor", "Target", "Details", "Impact", "Waiting", "Preview expires"],
    rows,
    "Nothing is waiting for your decision.",
  );
}

// ---- one call: decide or trace -----------------------------------------------------------

async function callPage(callId) {
  show(el("p", { class: "muted" }, "Loading…"));
  let call;
  try {
    call = await api(`/calls/${encodeURIComponent(callId)}`);
  } catch (error) {
    show(problemBox(error));
    return;
  }
  const previews = call.dry_runs;
  const latest = previews.length ? previews[previews.length - 1] : null;
  const earlier = previews.length > 1 ? previews[previews.length - 2] : null;
  const proposal = call.proposal;
  const taint = call.taint || proposal.taint;
  show(
    el(
      "section",
      {},
      el("h1", {}, `${call.tool} `, el("span", { class: `state ${call.state}`, id: "state" }, call.state)),
      facts([
        ["Call", call.call_id],
        ["Actor", `${call.actor} (${call.tenant})`],
        ["Target", target(proposal.target)],
        ["Impact", proposal.impact],
        ["Proposed by", proposal.proposed_by],
        ["Policy version", proposal.policy_version],
        ["Arguments fingerprint", proposal.fingerprint],
        ["Preview expires", latest ? `${when(latest.expires_at)} (${remaining(latest.expires_at)})` : "—"],
      ]),
      latest && warnings(latest.snapshot).length ? warningBox(warnings(latest.snapshot)) : null,
      taint && taint.length ? taintBox(taint) : null,
      proposal.endorsement && proposal.endorsement.length ? endorsementBox(proposal.endorsement) : null,
      el(
        "div",
        { class: "columns" },
        el("div", { class: "card" }, el("h2", {}, "Arguments"), argumentsTable(proposal)),
        el(
          "div",
          { class: "card" },
          el("h2", {}, "Preview"),
          latest ? previewOf(latest) : el("p", { class: "empty" }, "No preview yet."),
          earlier ? changes(earlier, latest) : null,
        ),
      ),
      decisionBox(call, latest),
      timeline(call),
    ),
  );
}

function facts(pairs) {
  return el(
    "dl",
    { class: "facts" },
    pairs.map(([name, value]) => [el("dt", {}, name), el("dd", {}, value ?? "—")]),
  );
}

function argumentsTable(proposal) {
  const args = proposal.arguments || {};
  const revealed = proposal.sensitive_arguments || {};
  const rows = Object.entries(args).map(([name, value]) => {
    const unmasked = Object.hasOwn(revealed, name); // not "in": every object has a "constructor"
    const sensitive = value === "[redacted]" || unmasked;
    const shown = unmasked ? revealed[name] : value;
    return el(
      "tr",
      { "data-argument": name },
      el(
        "th",
        {},
        name,
        sensitive ? el("span", { class: "badge" }, "sensitive") : null,
        unendorsed(proposal.endorsement).some((found) => found.argument === name)
          ? el("span", { class: "badge" }, "unendorsed")
          : null,
      ),
      el("td", {}, el("code", {}, typeof shown === "string" ? shown : json(shown))),
    );
  });
  return el("table", { class: "arguments", id: "arguments" }, el("tbody", {}, rows));
}

function taintBox(taint) {
  return el(
    "div",
    { class: "warning", id: "taint" },
    el("strong", {}, "Values from untrusted results"),
    el(
      "ul",
      {},
      taint.map((mark) =>
        el(
          "li",
          {},
          `argument ${mark.argument} came from the result of `,
          el("a", { href: `/console/calls/${encodeURIComponent(mark.source_call_id)}` }, mark.source_call_id),
        ),
      ),
    ),
  );
}

const ENDORSED_BY = {
  task: "the run's task (the user's own words)",
  trusted_result: "a trusted result returned earlier in the run",
  known: "a value vouched for before, by an admin or approvers (a known value)",
};

/** The arguments whose value nobody the user trusts has vouched for. */
function unendorsed(endorsement) {
  return (endorsement || []).filter((found) => !found.endorsed);
}

function endorsementBox(endorsement) {
  const missing = unendorsed(endorsement);
  return el(
    "div",
    { class: missing.length ? "warning" : "ok", id: "endorsement" },
    el("strong", {}, missing.length ? "Values nobody the user trusts has vouched for" : "Where the values come from"),
    el(
      "ul",
      {},
      endorsement.map((found) =>
        el(
          "li",
          { "data-endorsement": found.argument },
          `argument ${found.argument}: `,
          found.endorsed
            ? found.source
              ? `endorsed by ${ENDORSED_BY[found.source] || found.source}`
              : "holds nothing that needs endorsing"
            : `not endorsed${found.reason ? ` (${found.reason})` : ""}`,
        ),
      ),
    ),
  );
}

/** A preview: what the provider says it would change (before → after), when it says so,
 * with the raw preview one click away; else the raw preview. */
function previewOf(preview) {
  const raw = el("pre", { id: "preview" }, json(preview.snapshot));
  const stamp = el("p", { class: "hash" }, `snapshot ${preview.snapshot_hash}, previewed ${when(preview.created_at)}`);
  const listed = changesOf(preview.snapshot);
  if (!listed.length) return [raw, stamp];
  const rows = listed.map((change) =>
    el(
      "tr",
      { "data-path": change.path },
      el("th", {}, change.path),
      el("td", { class: `old ${kind(change.before)}` }, shown(change.before)),
      el("td", { class: `new ${kind(change.after)}` }, shown(change.after)),
    ),
  );
  return [
    el(
      "table",
      { id: "before-after" },
      el("thead", {}, el("tr", {}, el("th", {}, "What changes"), el("th", {}, "Before"), el("th", {}, "After"))),
      el("tbody", {}, rows),
    ),
    el("details", { id: "raw-preview" }, el("summary", {}, "Raw preview"), raw),
    stamp,
  ];
}

/** The preview's ``changes`` a provider answered, those well-formed: {path, before, after}. */
function changesOf(snapshot) {
  const listed = snapshot && Array.isArray(snapshot.changes) ? snapshot.changes : [];
  return listed.filter((c) => c && typeof c === "object" && typeof c.path === "string");
}

/** The preview's ``warnings``, as text. */
function warnings(snapshot) {
  const listed = snapshot && Array.isArray(snapshot.warnings) ? snapshot.warnings : [];
  return listed.map((w) => (typeof w === "string" ? w : json(w)));
}

function warningBox(told) {
  return el(
    "div",
    { class: "problem", id: "warnings", role: "alert" },
    el("strong", {}, "The provider warns"),
    el("ul", {}, told.map((w) => el("li", {}, w))),
  );
}

/** A value as a cell shows it: text as is, anything else as JSON; absent as such. */
function shown(value) {
  if (value === undefined) return "(absent)";
  return typeof value === "string" ? value : json(value);
}

/** Money (numbers) and dates stand out in a before → after table. */
function kind(value) {
  if (typeof value === "number") return "money";
  if (typeof value === "string" && /^\d{4}-\d{2}-\d{2}/.test(value)) return "date";
  return "";
}

/** What differs between two previews, path by path. */
function changes(before, after) {
  const found = [];
  const walk = (a, b, path) => {
    if (json(a) === json(b)) return;
    const objects = a && b && typeof a === "object" && typeof b === "object";
    if (objects && Array.isArray(a) === Array.isArray(b)) {
      for (const key of new Set([...Object.keys(a), ...Object.keys(b)])) {
        walk(a[key], b[key], path ? `${path}.${key}` : key);
      }
      return;
    }
    found.push([path || "(whole preview)", a, b]);
  };
  walk(before.snapshot, after.snapshot, "");
  const rows = found.map(([path, a, b]) =>
    el(
      "tr",
      {},
      el("th", {}, path),
      el("td", { class: "old" }, a === undefined ? "(absent)" : json(a)),
      el("td", { class: "new" }, b === undefined ? "(absent)" : json(b)),
    ),
  );
  return el(
    "div",
    { id: "changes" },
    el("h3", {}, `Changed since the preview of ${when(before.created_at)}`),
    found.length
      ? el(
          "table",
          {},
          el("thead", {}, el("tr", {}, el("th", {}, "Field"), el("th", {}, "Before"), el("th", {}, "Now"))),
          el("tbody", {}, rows),
        )
      : el("p", { class: "muted" }, "Nothing: the two previews are the same."),
  );
}

// "k/N" when a call needs several approvers (approval.quorum), else null.
function quorum(approvals) {
  return approvals && !approvals.endsWith("/1") ? approvals : null;
}

function decisionBox(call, latest) {
  const agreed = quorum(call.approvals);
  const [given, needed] = agreed ? agreed.split("/") : [];
  const awaited = agreed
    ? el("p", { id: "quorum" }, `${given} of the ${needed} approvers it needs have approved this preview; it runs once all ${needed} have.`)
    : null;
  if (!call.may_decide) {
    const approval = call.approval;
    if (!approval) return null;
    const partly = approval.decision === "approve" && call.state === "awaiting_approval";
    return el(
      "div",
      { class: "card", id: "decided" },
      el("h2", {}, approval.decision !== "approve" ? "Rejected" : partly ? `Approved by ${given} of ${needed}` : "Approved"),
      awaited,
      el("p", {}, `by ${approval.approver} at ${when(approval.created_at)}`),
      approval.comment ? el("p", {}, `“${approval.comment}”`) : null,
      approval.decision === "approve"
        ? el("p", {}, `valid until ${when(approval.expires_at)}; `, approval.consumed_by ? "used" : "not used yet")
        : null,
    );
  }
  const shownHash = latest ? latest.snapshot_hash : null;
  const comment = el("textarea", { id: "comment", rows: 2, maxlength: 2000, placeholder: "optional" });
  const confirm = el("input", { type: "checkbox", id: "confirm" });
  const warned = latest ? warnings(latest.snapshot).length > 0 : false;
  const confirmWarnings = el("input", { type: "checkbox", id: "confirm-warnings" });
  const ready = () => confirm.checked && (!warned || confirmWarnings.checked);
  const remember = unendorsed(call.proposal.endorsement).map((found) => ({
    argument: found.argument,
    box: el("input", { type: "checkbox", "data-remember": found.argument }),
  }));
  const outcome = el("div", { id: "outcome" });
  const approveButton = el("button", { type: "button", id: "approve", class: "approve", disabled: true }, "Approve");
  const rejectButton = el("button", { type: "button", id: "reject", class: "reject" }, "Reject");
  for (const box of [confirm, confirmWarnings]) {
    box.addEventListener("change", () => {
      approveButton.disabled = !ready();
    });
  }
  const decide = async (decision) => {
    approveButton.disabled = rejectButton.disabled = true;
    try {
      const answer = await api("/approve", {
        method: "POST",
        body: {
          call_id: call.call_id,
          snapshot_hash: shownHash,
          decision,
          comment: comment.value.trim() || null,
          remember:
            decision === "approve"
              ? remember.filter((choice) => choice.box.checked).map((choice) => choice.argument)
              : [],
        },
      });
      outcome.replaceChildren(
        el(
          "p",
          { class: "done", role: "status" },
          decision === "approve"
            ? `Approved (${answer.approval_id}${quorum(answer.approvals) ? `, ${answer.approvals} approvers` : ""}), valid until ${when(answer.expires_at)}.`
            : "Rejected.",
        ),
      );
      setTimeout(() => callPage(call.call_id), 1500);
    } catch (error) {
      const changed = error.code === "approval_mismatch";
      outcome.replaceChildren(
        problemBox(
          changed
            ? Object.assign(new Error(
                "The call changed after this page showed it (" +
                  (error.body.mismatch || []).join(", ") +
                  "). Nothing was approved or rejected. Reload to see the call as it is now.",
              ), { code: "preview changed" })
            : error,
          changed ? el("button", { type: "button", id: "reload", onclick: () => callPage(call.call_id) }, "Reload") : null,
        ),
      );
      rejectButton.disabled = false;
      approveButton.disabled = changed || !ready();
    }
  };
  approveButton.addEventListener("click", () => decide("approve"));
  rejectButton.addEventListener("click", () => decide("reject"));
  return el(
    "div",
    { class: "card decide", id: "decide" },
    el("h2", {}, "Your decision"),
    el(
      "p",
      {},
      "Approving lets ",
      el("strong", {}, call.actor),
      " run ",
      el("strong", {}, call.tool),
      " once, with exactly the arguments and preview shown above",
      shownHash ? ` (snapshot ${shownHash.slice(0, 19)}…)` : "",
      ". Any change to them needs a new approval.",
    ),
    awaited,
    el("label", { for: "comment" }, "Comment"),
    comment,
    remember.map((choice) =>
      el(
        "label",
        { class: "check" },
        choice.box,
        ` Also vouch for this ${choice.argument} from now on: calls with the same value will not need an approval for it`,
      ),
    ),
    el("label", { class: "check" }, confirm, " I have checked the arguments and the preview above"),
    warned
      ? el("label", { class: "check" }, confirmWarnings, " I have read the provider's warnings and still approve")
      : null,
    el("div", { class: "buttons" }, approveButton, rejectButton),
    outcome,
  );
}

function timeline(call) {
  const rows = call.decisions.map((event) =>
    el(
      "tr",
      {},
      el("td", {}, String(event.seq)),
      el("td", {}, when(event.at)),
      el("td", {}, event.event),
      el("td", {}, event.decision || ""),
      el("td", {}, event.code || ""),
      el("td", {}, (event.authorized_by && event.authorized_by.sub) || ""),
      el("td", {}, event.reason || ""),
    ),
  );
  const executions = call.executions.map((x) =>
    el("li", {}, `${x.operation_id}: ${x.state}`, x.provider_status ? ` (provider ${x.provider_status})` : ""),
  );
  return el(
    "div",
    { class: "card", id: "timeline" },
    el("h2", {}, "Timeline"),
    table(["#", "At", "Event", "Decision", "Code", "By", "Reason"], rows, "No events yet."),
    executions.length ? [el("h3", {}, "Executions"), el("ul", {}, executions)] : null,
  );
}

// ---- the auditor's page ------------------------------------------------------------------

const FILTERS = ["tenant", "actor", "tool", "call_id", "run_id", "event", "since", "until"];
const EVENTS = ["", "proposed", "denied", "dry_run", "approved", "rejected", "executed", "replayed", "failed", "reconciled", "expired"];

function auditPage() {
  const inputs = Object.fromEntries(
    FILTERS.map((name) => [
      name,
      name === "event"
        ? el("select", { id: `f-${name}`, name }, EVENTS.map((e) => el("option", { value: e }, e || "any")))
        : el("input", {
            id: `f-${name}`,
            name,
            autocomplete: "off",
            placeholder: name === "since" || name === "until" ? "2026-01-31T00:00:00Z" : "",
          }),
    ]),
  );
  const results = el("div", { id: "results" });
  const verdict = el("div", { id: "verdict" });
  const query = () => {
    const params = new URLSearchParams();
    for (const name of FILTERS) if (inputs[name].value.trim()) params.set(name, inputs[name].value.trim());
    return params;
  };
  const search = async (cursor, rows = []) => {
    const params = query();
    params.set("limit", "100");
    if (cursor) params.set("cursor", cursor);
    try {
      const page = await api(`/audit?${params}`);
      const all = rows.concat(page.items.map(auditRow));
      results.replaceChildren(
        table(["#", "At", "Event", "Tenant", "Actor", "Tool", "Call", "Decision", "Code", "Reason"], all, "No events match."),
        ...(page.next_cursor
          ? [el("button", { type: "button", id: "more", onclick: () => search(page.next_cursor, all) }, "More")]
          : []),
      );
    } catch (error) {
      results.replaceChildren(problemBox(error));
    }
  };
  const verify = async () => {
    verdict.replaceChildren(el("p", { class: "muted" }, "Verifying…"));
    try {
      const report = await api("/audit/verify");
      verdict.replaceChildren(
        el(
          "div",
          { class: report.ok ? "ok" : "problem", role: "status", id: "verify-result" },
          el("strong", {}, report.ok ? "Chain intact" : "Chain NOT intact"),
          ` — ${report.checked} rows checked, sealed through ${report.sealed_through}, ${report.unsealed} not sealed yet`,
          report.signed ? `, head signed (key ${report.key_id})` : ", head not signed",
          report.first_broken ? el("pre", {}, json(report.first_broken)) : null,
        ),
      );
    } catch (error) {
      verdict.replaceChildren(problemBox(error));
    }
  };
  const exportLink = el("a", { id: "download", hidden: true }, "");
  const exportAll = async () => {
    try {
      const response = await api(`/audit/export?${query()}`, { raw: true });
      const blob = await response.blob();
      exportLink.href = URL.createObjectURL(blob);
      exportLink.download = `toolgate-audit-${new Date().toISOString().replace(/[:.]/g, "-")}.ndjson`;
      exportLink.textContent = `Download ${exportLink.download} (${blob.size} bytes)`;
      exportLink.hidden = false;
    } catch (error) {
      verdict.replaceChildren(problemBox(error));
    }
  };
  show(
    el(
      "section",
      {},
      el("h1", {}, "Audit trail"),
      el(
        "form",
        {
          class: "card filters",
          onsubmit: (event) => {
            event.preventDefault();
            search();
          },
        },
        FILTERS.map((name) => el("label", {}, name.replace("_", " "), inputs[name])),
        el(
          "div",
          { class: "buttons" },
          el("button", { type: "submit", id: "search" }, "Search"),
          el("button", { type: "button", id: "export", onclick: exportAll }, "Export NDJSON"),
          el("button", { type: "button", id: "verify", onclick: verify }, "Verify chain"),
          exportLink,
        ),
      ),
      verdict,
      results,
    ),
  );
  search();
}

function auditRow(item) {
  return el(
    "tr",
    {},
    el("td", {}, String(item.seq)),
    el("td", {}, when(item.time)),
    el("td", {}, item.event),
    el("td", {}, item.tenant),
    el("td", {}, item.actor || ""),
    el("td", {}, item.tool || ""),
    el("td", {}, item.call_id ? el("a", { href: `/console/calls/${encodeURIComponent(item.call_id)}` }, item.call_id) : ""),
    el("td", {}, item.decision || ""),
    el("td", {}, item.code || ""),
    el("td", {}, item.reason || ""),
  );
}

// ---- routing -----------------------------------------------------------------------------

async function render() {
  clearInterval(refreshTimer);
  const who = document.getElementById("who");
  const signOut = document.getElementById("sign-out");
  let notice = null;
  if (location.pathname === "/console/callback") {
    try {
      await finishSignIn();
    } catch (error) {
      notice = problemBox(error);
      history.replaceState(null, "", "/console");
    }
  }
  const value = token();
  if (!value) {
    who.textContent = "";
    signOut.hidden = true;
    await signIn(notice);
    return;
  }
  const back = sessionStorage.getItem(EXPIRED_KEY);
  if (back) {
    sessionStorage.removeItem(EXPIRED_KEY);
    history.replaceState(null, "", returnPath(back)); // signed in again: back where it ran out
  }
  const c = claims(value);
  const roles = Array.isArray(c.roles) ? c.roles.join(", ") : "";
  who.textContent = `${c.sub || "?"} · ${c.tid || "?"}${roles ? ` · ${roles}` : ""}`;
  signOut.hidden = false;
  const path = location.pathname.replace(/\/+$/, "");
  const call = path.match(/^\/console\/calls\/([^/]+)$/);
  if (call) callPage(decodeURIComponent(call[1]));
  else if (path === "/console/audit") auditPage();
  else inboxPage();
}

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(EXPIRED_KEY);
  render();
});
takeTokenFromFragment();
render();
