"""The API docs page (Swagger UI) follows the browser's colour scheme, as the dashboard does.

The page is photographed and the photograph measured in the browser itself (a canvas), so the test
sees what a person sees, whatever CSS makes it so."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Mean relative luminance (0 black, 1 white) and the share of near-white pixels of a PNG.
MEASURE = """async (source) => {
  const image = new Image();
  image.src = source;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width;
  canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  let sum = 0, bright = 0;
  for (let i = 0; i < data.length; i += 4) {
    const luminance = (0.2126 * data[i] + 0.7152 * data[i + 1] + 0.0722 * data[i + 2]) / 255;
    sum += luminance;
    if (luminance > 0.85) bright += 1;
  }
  const pixels = data.length / 4;
  return { mean: sum / pixels, bright: bright / pixels };
}"""


def measure(browser: Any, png: bytes) -> dict[str, float]:
    page = browser.new_page()
    try:
        return page.evaluate(MEASURE, "data:image/png;base64," + base64.b64encode(png).decode())
    finally:
        page.close()


def test_the_api_docs_follow_the_colour_scheme(tab: Pages, browser: Any) -> None:
    make_person("ada", "admin")
    tab.login("ada")
    tab.goto("/api/docs/")
    tab.page.wait_for_selector(".swagger-ui .opblock-tag", timeout=30_000)
    tab.page.locator(".swagger-ui .opblock").first.click()  # an open operation: its parameters, its responses
    tab.page.wait_for_selector(".swagger-ui .opblock.is-open .parameters-container, .swagger-ui .opblock-body")
    tab.shot("api docs")

    seen = measure(browser, tab.page.screenshot())

    if tab.name.endswith("-dark"):
        assert seen["mean"] < 0.3 and seen["bright"] < 0.05, seen
    else:
        assert seen["mean"] > 0.7, seen
