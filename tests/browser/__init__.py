"""The browser tests: the dashboard in Chromium (Playwright) against a real tensorvaultd."""
