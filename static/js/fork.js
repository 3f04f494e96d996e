// Rewind & branch form: check the edited state is a JSON object as it is typed, and before it is
// sent for review, so a typo shows next to the editor instead of costing a round trip.
const form = document.getElementById("fork-form");
const field = document.getElementById("fork-state");
const errors = document.getElementById("state-errors");
const editor = document.getElementById("state-editor");

function problem(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return `This is not valid JSON: ${error.message}`;
  }
  return value !== null && typeof value === "object" && !Array.isArray(value)
    ? "" : "The state must be a JSON object ({…}).";
}

function check() {
  const message = problem(field.value);
  errors.replaceChildren();
  if (!message) {
    field.removeAttribute("aria-invalid");
    return true;
  }
  field.setAttribute("aria-invalid", "true");
  const item = document.createElement("li");
  item.textContent = message;
  errors.append(item);
  return false;
}

if (form && field && errors) {
  let timer;
  // Parsing a large state on every keystroke would make typing lag; wait for a pause.
  field.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(check, 200);
  });
  form.addEventListener("submit", (event) => {
    if (check()) return;
    event.preventDefault();
    if (editor) editor.open = true;
    field.focus();
  });
}
