// Checkpoint page: j / k step to the next / previous checkpoint, the raw-JSON toggle,
// expand / collapse all, and copying a node's JSON pointer.

const RAW_KEY = "quicksave.checkpoint.raw";

function isTyping(element) {
  return element instanceof HTMLElement &&
    (element.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(element.tagName));
}

document.addEventListener("keydown", (event) => {
  if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || isTyping(event.target)) {
    return;
  }
  const rel = { j: "next", k: "prev" }[event.key];
  const link = rel && document.querySelector(`a[rel="${rel}"]`);
  if (link) {
    event.preventDefault();
    window.location.assign(link.href);
  }
});

// Storage can be blocked (privacy settings, sandboxed frames): remembering the view is a nicety.
function remember(value) {
  try { window.sessionStorage.setItem(RAW_KEY, value ? "1" : ""); } catch { /* not remembered */ }
}
function remembered() {
  try { return window.sessionStorage.getItem(RAW_KEY) === "1"; } catch { return false; }
}

const toggle = document.getElementById("toggle-raw");
const tree = document.getElementById("state-tree");
const raw = document.getElementById("raw-json");

function showRaw(on) {
  if (!toggle || !tree || !raw) return;
  toggle.setAttribute("aria-pressed", String(on));
  toggle.textContent = on ? "Show tree" : "Show raw JSON";
  tree.hidden = on;
  raw.hidden = !on;
  for (const id of ["expand-all", "collapse-all"]) {
    const button = document.getElementById(id);
    if (button) button.hidden = on;
  }
}

if (toggle) {
  toggle.addEventListener("click", () => {
    const on = toggle.getAttribute("aria-pressed") !== "true";
    showRaw(on);
    remember(on);
  });
  // Keep the reader's choice while stepping through checkpoints with j / k.
  if (remembered()) showRaw(true);
}

function setAllOpen(open) {
  if (!tree) return;
  for (const details of tree.querySelectorAll("details")) details.open = open;
}
document.getElementById("expand-all")?.addEventListener("click", () => setAllOpen(true));
document.getElementById("collapse-all")?.addEventListener("click", () => setAllOpen(false));

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch { /* denied: fall back below */ }
  }
  // Plain http (no Clipboard API): copy through a selected, off-screen textarea.
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.top = "-1000px";
  document.body.append(area);
  area.select();
  let copied = false;
  try { copied = document.execCommand("copy"); } catch { copied = false; }
  area.remove();
  return copied;
}

const timers = new WeakMap();

document.addEventListener("click", async (event) => {
  const button = event.target instanceof Element ? event.target.closest(".copy-path") : null;
  if (!button) return;
  // The button may sit in a <summary>: copy, don't fold the node.
  event.preventDefault();
  const path = button.dataset.path ?? "";
  const copied = await copyText(path);
  const label = button.dataset.label ?? button.textContent;
  button.dataset.label = label;
  button.textContent = copied ? "copied" : "copy failed";
  button.classList.toggle("copied", copied);
  button.classList.toggle("copy-failed", !copied);
  button.title = copied ? `Copied ${path}` : `Select and copy: ${path}`;
  clearTimeout(timers.get(button));
  timers.set(button, setTimeout(() => {
    button.textContent = label;
    button.classList.remove("copied", "copy-failed");
  }, 1500));
});
