// A state tree (templates/checkpoints/_state_tree.html): its "copy path" buttons copy a node's JSON
// pointer, and the tree is one Tab stop: arrow keys move between its
// nodes, Right and Left open and close them, "c" copies the focused node's JSON pointer (its
// "copy path" button, which the mouse still reaches) and "h" opens its value's history (its
// "history" link, where the page offers one). Before, every node's button was a Tab stop
// of its own: ninety to get past a modest state.

function visibleNodes(tree) {
  return [...tree.querySelectorAll("summary, li.leaf")].filter(
    (node) => !node.parentElement.closest("details:not([open]) > ul"),
  );
}

function moveTo(tree, node) {
  for (const other of tree.querySelectorAll('[tabindex="0"]')) other.tabIndex = -1;
  node.tabIndex = 0;
  node.focus();
}

export function navigableTree(tree) {
  if (!tree) return;
  const nodes = [...tree.querySelectorAll("summary, li.leaf")];
  if (nodes.length === 0) return;
  for (const node of nodes) node.tabIndex = -1;
  for (const button of tree.querySelectorAll(".copy-path, .value-history")) button.tabIndex = -1;
  nodes[0].tabIndex = 0;

  tree.addEventListener("focusin", (event) => {
    const node = event.target.closest?.("summary, li.leaf");
    if (node && tree.contains(node) && node.tabIndex !== 0) {
      for (const other of tree.querySelectorAll('[tabindex="0"]')) other.tabIndex = -1;
      node.tabIndex = 0;
    }
  });

  tree.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const node = event.target;
    if (!(node instanceof HTMLElement) || !node.matches("summary, li.leaf")) return;
    const visible = visibleNodes(tree);
    const at = visible.indexOf(node);
    const details = node.tagName === "SUMMARY" ? node.parentElement : null;
    let target = null;
    if (event.key === "ArrowDown") target = visible[at + 1];
    else if (event.key === "ArrowUp") target = visible[at - 1];
    else if (event.key === "Home") target = visible[0];
    else if (event.key === "End") target = visible[visible.length - 1];
    else if (event.key === "ArrowRight" && details) {
      if (!details.open) details.open = true;
      else target = visibleNodes(tree)[at + 1];
    } else if (event.key === "ArrowLeft") {
      if (details?.open) details.open = false;
      else target = (details ?? node).parentElement.closest("details")?.querySelector(":scope > summary") ?? null;
    } else if (event.key === "c") {
      node.querySelector(":scope > .copy-path")?.click();
    } else if (event.key === "h") {
      const link = node.querySelector(":scope > .value-history");
      if (!link) return;
      window.location.assign(link.href);
    } else {
      return; // Enter and Space fold a node as a summary always does; j / k still step checkpoints
    }
    event.preventDefault();
    event.stopPropagation();
    if (target) moveTo(tree, target);
  });
}

// Copying a node's path, wherever a state tree is shown (the checkpoint and approval pages).
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
