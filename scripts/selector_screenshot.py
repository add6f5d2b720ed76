"""docs/selector.png, README's picture of the index's human page: the browser test's demo index (fake
flash-attn wheels, no build) opened in headless Chromium, a machine picked. `make selector-screenshot`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from publish_helpers import chromium, selector_index  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        idx = selector_index(Path(tmp))
        browser = chromium(width=1200, height=1120)
        try:
            browser.get((idx / "index.html").as_uri())
            Select(browser.find_element(By.ID, "cuda")).select_by_value("t:13.0")
            Select(browser.find_element(By.ID, "python")).select_by_value("3.12")
            browser.find_element(By.ID, "gpu").send_keys("H100")
            browser.find_element(By.TAG_NAME, "h1").click()  # close the GPU suggestions
            browser.save_screenshot(str(out))
        finally:
            browser.quit()
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "selector.png")
