// tether live view: exchanges the link's one-time token for a session
// cookie, opens the control channel and the screen (noVNC), and shows who
// holds input. The server decides everything; this page only asks.
import RFB from "/novnc/core/rfb.js";

const $ = (id) => document.getElementById(id);
const wsBase = (location.protocol === "https:" ? "wss://" : "ws://") + location.host;

const view = { rfb: null, viewer: "", role: "", state: null, zoom: 0, mods: new Set(), closed: "" };
window.tetherView = view; // read by the browser tests; holds no secret

// X keysyms and the physical keys (KeyboardEvent.code) noVNC maps to
// QEMU's scancodes, for the US layout the guest expects.
const special = {
  Enter: [0xff0d, "Enter"], Escape: [0xff1b, "Escape"], Tab: [0xff09, "Tab"],
  shift: [0xffe1, "ShiftLeft"], ctrl: [0xffe3, "ControlLeft"], alt: [0xffe9, "AltLeft"],
};
const unshifted = "`1234567890-=[]\\;',./";
const shifted = "~!@#$%^&*()_+{}|:\"<>?";
const codes = ["Backquote", "Digit1", "Digit2", "Digit3", "Digit4", "Digit5", "Digit6", "Digit7", "Digit8", "Digit9",
  "Digit0", "Minus", "Equal", "BracketLeft", "BracketRight", "Backslash", "Semicolon", "Quote", "Comma", "Period", "Slash"];

// keyFor returns [keysym, code, shift] for one character, or null.
function keyFor(ch) {
  if (ch === "\n") return [special.Enter[0], special.Enter[1], false];
  if (ch === "\t") return [special.Tab[0], special.Tab[1], false];
  if (ch === " ") return [0x20, "Space", false];
  if (/^[a-z]$/.test(ch)) return [ch.charCodeAt(0), "Key" + ch.toUpperCase(), false];
  if (/^[A-Z]$/.test(ch)) return [ch.charCodeAt(0), "Key" + ch, true];
  let i = unshifted.indexOf(ch);
  if (i >= 0) return [ch.charCodeAt(0), codes[i], false];
  i = shifted.indexOf(ch);
  if (i >= 0) return [ch.charCodeAt(0), codes[i], true];
  return null;
}

// press sends one key with the sticky modifiers (and shift if needed)
// held around it, then clears the modifiers.
function press(keysym, code, shift) {
  const held = [...view.mods].map((m) => special[m]);
  if (shift && !view.mods.has("shift")) held.push(special.shift);
  for (const [s, c] of held) view.rfb.sendKey(s, c, true);
  view.rfb.sendKey(keysym, code);
  for (const [s, c] of held.reverse()) view.rfb.sendKey(s, c, false);
  clearMods(); // sticky modifiers apply to the next key only
}

function clearMods() {
  view.mods.clear();
  for (const b of document.querySelectorAll("[data-mod]")) b.setAttribute("aria-pressed", "false");
}

function say(msg) { $("message").textContent = msg || ""; }

async function exchange() {
  const m = location.hash.match(/^#t=([0-9a-f]{16}\.[A-Za-z0-9_-]{43})$/);
  if (location.hash) history.replaceState(null, "", location.pathname);
  if (!m) return true;
  const r = await fetch("/api/session", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: m[1] }), credentials: "same-origin",
  });
  if (r.ok) return true;
  const e = await r.json().catch(() => ({}));
  say("This link cannot be used: " + (e.code || r.status) + ". Ask for a new one.");
  return false;
}

function openControl() {
  const ws = new WebSocket(wsBase + "/ws/control");
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type === "hello") {
      view.viewer = m.viewer; view.role = m.role;
      $("status").textContent = m.role === "control" ? "Control" : "View only";
      openScreen();
    } else if (m.type === "state") {
      applyState(m);
    } else if (m.type === "error") {
      say(m.op + ": " + m.message);
    } else if (m.type === "closed") {
      view.closed = m.reason;
    }
  };
  ws.onclose = () => {
    $("status").textContent = "Disconnected" + (view.closed ? " (" + view.closed + ")" : "");
    setHidden({ takeover: true, handback: true, pause: true, resume: true, sendtext: true, keys: true });
    if (view.rfb) view.rfb.disconnect();
  };
  view.control = ws;
}

function openScreen() {
  const rfb = new RFB($("screen"), wsBase + "/ws/rfb?viewer=" + view.viewer, { shared: true });
  rfb.viewOnly = true;
  rfb.scaleViewport = true;
  rfb.background = "#000";
  rfb.addEventListener("connect", () => applyZoom());
  view.rfb = rfb;
}

function send(op) { view.control.send(JSON.stringify({ op })); }

function fmt(t) { return t ? new Date(t).toLocaleTimeString() : ""; }

function applyState(s) {
  const was = view.state || {};
  view.state = s;
  const mine = s.holder_is_you;
  if ((was.holder_is_you && !mine) || (!was.paused && s.paused)) {
    $("text").value = ""; // hand-back and pause clear unsent text
    clearMods();
  }
  $("holder").textContent = mine ? "You hold input since " + fmt(s.since) + " (until " + fmt(s.expires) + ")"
    : s.holder ? s.holder + " holds input since " + fmt(s.since) : "The agent holds input";
  $("banner").hidden = !s.paused;
  $("banner").textContent = s.paused ? "VM paused by " + s.paused_by + " since " + fmt(s.paused_since) : "";
  const control = view.role === "control";
  const pauses = control && !s.pause_owner; // an owner's VM is paused and resumed by the owner only
  setHidden({
    takeover: !control || mine || !!s.holder, handback: !mine,
    pause: !pauses || s.paused, resume: !pauses || !s.paused,
    sendtext: !mine || s.paused, keys: !mine || s.paused,
  });
  if (view.rfb) view.rfb.viewOnly = !mine || s.paused;
  if (mine && view.rfb) view.rfb.focus();
}

function setHidden(m) { for (const [id, h] of Object.entries(m)) $(id).hidden = h; }

// applyZoom fits the screen to the window (zoom 0) or sizes it to the
// guest's pixels times the zoom inside the scrolling viewport.
function applyZoom() {
  const screen = $("screen");
  const canvas = screen.querySelector("canvas");
  for (const b of document.querySelectorAll("#zoom button")) {
    b.setAttribute("aria-pressed", String((b.dataset.zoom ? Number(b.dataset.zoom) : 0) === view.zoom));
  }
  if (!view.zoom || !canvas) {
    screen.style.width = screen.style.height = "100%";
    return;
  }
  screen.style.width = canvas.width * view.zoom + "px";
  screen.style.height = canvas.height * view.zoom + "px";
}

function wire() {
  $("takeover").onclick = () => send("takeover");
  $("handback").onclick = () => send("handback");
  $("pause").onclick = () => send("pause");
  $("resume").onclick = () => send("resume");
  $("fit").onclick = () => { view.zoom = 0; applyZoom(); };
  for (const b of document.querySelectorAll("[data-zoom]")) {
    b.onclick = () => { view.zoom = Number(b.dataset.zoom); applyZoom(); };
  }
  for (const b of document.querySelectorAll("[data-key]")) {
    b.onclick = () => { const [s, c] = special[b.dataset.key]; press(s, c, false); };
  }
  for (const b of document.querySelectorAll("[data-mod]")) {
    b.onclick = () => {
      const m = b.dataset.mod;
      if (view.mods.has(m)) view.mods.delete(m); else view.mods.add(m);
      b.setAttribute("aria-pressed", String(view.mods.has(m)));
    };
  }
  $("sendtext").onsubmit = (ev) => {
    ev.preventDefault();
    const text = $("text").value;
    const keys = [...text].map(keyFor);
    if (keys.some((k) => k === null)) { say("Only US-keyboard characters can be sent."); return; }
    for (const [s, c, shift] of keys) press(s, c, shift);
    $("text").value = "";
    say("");
  };
}

wire();
exchange().then((ok) => { if (ok) openControl(); }, (e) => say(String(e)));
