// The decision page: check the edited arguments are JSON before they are sent.
const form = document.getElementById("edit-form");
const field = document.getElementById("edit-args");
const errors = document.getElementById("args-errors");

function check() {
  try {
    JSON.parse(field.value);
    field.removeAttribute("aria-invalid");
    errors.textContent = "";
    return true;
  } catch (error) {
    field.setAttribute("aria-invalid", "true");
    errors.innerHTML = "";
    const item = document.createElement("li");
    item.textContent = `This is not valid JSON: ${error.message}`;
    errors.append(item);
    return false;
  }
}

if (form && field && errors) {
  field.addEventListener("input", check);
  form.addEventListener("submit", (event) => {
    if (!check()) event.preventDefault();
  });
}
