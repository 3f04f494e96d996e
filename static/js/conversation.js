// The checkpoint page's conversation: its button switches between the conversation and the same
// messages in the state tree (opened at their path, scrolled to and focused). Without scripts the
// conversation and the tree both show, and the button stays hidden.
const toggle = document.getElementById("toggle-conversation");
const body = document.getElementById("conversation-body");
const tree = document.getElementById("state-tree");

function treeNode(path) {
  if (!tree) return null;
  for (const button of tree.querySelectorAll("button.copy-path")) {
    if (button.dataset.path === path) return button.closest("details") || button.closest("li");
  }
  return null;
}

function showTree(on) {
  toggle.setAttribute("aria-pressed", String(on));
  toggle.textContent = on ? "Show as conversation" : "Show as JSON tree";
  body.hidden = on;
  if (!on) return;
  const first = body.querySelector(".conversation");
  const node = first && treeNode(first.dataset.path);
  if (!node) return;
  for (let open = node; open; open = open.parentElement?.closest("details")) {
    if (open.tagName === "DETAILS") open.open = true;
  }
  node.scrollIntoView({ block: "start" });
  node.querySelector("summary")?.focus({ preventScroll: true });
}

if (toggle && body) {
  toggle.hidden = false;
  toggle.addEventListener("click", () => showTree(toggle.getAttribute("aria-pressed") !== "true"));
}
