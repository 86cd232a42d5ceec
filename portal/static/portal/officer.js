// The officer's forms, checked field by field (htmx puts a field's errors in its
// "<id>_errors" place): the inputs that place describes are marked invalid, or valid again.
document.addEventListener("htmx:afterSwap", (event) => {
  const place = event.detail.target;
  if (!place || !place.classList || !place.classList.contains("field-errors")) return;
  const invalid = place.querySelector(".errorlist li") !== null;
  document.querySelectorAll(`[aria-describedby~="${place.id}"]`).forEach((input) => {
    if (invalid) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
  });
});
