// On a phone a filter form folds away behind one button that says how many filters are set, so
// the list it filters starts on the first screen. Without this script the form stays open.
const FILTER_FORMS = 'form.filters[method="get"][aria-label^="Filter"]';

function setCount(form) {
  return [...form.elements].filter((field) => {
    if (field.tagName === "SELECT") return field.selectedIndex > 0;
    if (field.tagName !== "INPUT" || ["submit", "button", "hidden", "reset"].includes(field.type)) return false;
    return field.type === "checkbox" || field.type === "radio" ? field.checked : field.value.trim() !== "";
  }).length;
}

document.querySelectorAll(FILTER_FORMS).forEach((form, index) => {
  form.id ||= `filters-${index + 1}`;
  const set = setCount(form);
  const toggle = document.createElement("button");
  toggle.type = "button";
  toggle.className = "filters-toggle";
  toggle.setAttribute("aria-controls", form.id);
  toggle.setAttribute("aria-expanded", "false");
  toggle.textContent = set ? `Filters · ${set} set` : "Filters";
  toggle.addEventListener("click", () => {
    const open = form.classList.toggle("filters-open");
    toggle.setAttribute("aria-expanded", String(open));
  });
  form.classList.add("foldable");
  form.before(toggle);
});
