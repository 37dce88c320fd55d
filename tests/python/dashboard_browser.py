"""The taskhost web dashboard in headless Chromium, driven by Selenium.

Run by host/tests/dashboard.rs against a live `taskhost serve --http
--watch`, after it started tasks over MCP. Arguments come as one JSON object
on argv[1]:

  url         the server's root, e.g. http://127.0.0.1:41234/
  tokens      {"alice": ..., "bob": ..., "admin": ...}
  stream      alice's task that prints `first-line`, waits for the file
              `go_file`, then prints `second-line`
  go_file     the file that releases it
  victim      alice's long task to kill from the page
  quick       alice's task that completes at once
  ticker      alice's task on the wasm ticker plugin (v1)
  bob_task    bob's own task
  plugin      the ticker plugin file; `plugin_v2` holds the rebuilt bytes
  screenshots directory for the PNGs

Prints one line per step and exits non-zero with the reason on the first
failure. Every wait is on a DOM condition (WebDriverWait), never a sleep.
"""

import json
import os
import shutil
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

TIMEOUT = 60

args = json.loads(sys.argv[1])


def step(text):
    print(f"dashboard: {text}", flush=True)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="taskhost-chromium-")
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver from the Debian package, never one Selenium Manager fetches.
    service = Service(executable_path="/usr/bin/chromedriver")
    return webdriver.Chrome(service=service, options=options), profile


def wait(driver, condition, what):
    """Waits until `condition` is truthy. The page re-renders its tables on
    every event, so an element found a moment ago may be replaced: such a
    try simply runs again."""
    try:
        return WebDriverWait(
            driver, TIMEOUT, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
        ).until(lambda d: condition(d))
    except Exception as error:  # noqa: BLE001 - re-raised with context
        raise AssertionError(f"timed out waiting until {what}: {error!r}") from error


def row(driver, task):
    found = driver.find_elements(By.CSS_SELECTOR, f'tr[data-task-id="{task}"]')
    return found[0] if found else None


def act(driver, action, what):
    """Runs `action` (a click) on freshly found elements, again if they were
    replaced meanwhile."""
    wait(driver, lambda d: action(d) or True, what)


def status_of(driver, task):
    # In one script: the row cannot be replaced between finding and reading.
    return driver.execute_script(
        "const r = [...document.querySelectorAll('tr[data-task-id]')].find(r => r.dataset.taskId === arguments[0]);"
        "return r ? r.dataset.status : null;", task)


def sign_in(driver, token):
    driver.get(args["url"])
    box = wait(driver, lambda d: d.find_element(By.ID, "token") if d.find_element(By.ID, "token").is_displayed()
               else None, "the token form shows")
    box.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "[data-action='sign-in']").click()
    wait(driver, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "live",
         "the event stream is live")


def sign_out(driver):
    driver.find_element(By.CSS_SELECTOR, "[data-action='sign-out']").click()
    wait(driver, lambda d: d.find_element(By.ID, "token").is_displayed(), "the token form shows again")


def owners_shown(driver):
    return set(driver.execute_script(
        "return [...document.querySelectorAll('tr[data-task-id]')].map(r => r.dataset.owner);"))


def ids_shown(driver):
    return driver.execute_script("return [...document.querySelectorAll('tr[data-task-id]')].map(r => r.dataset.taskId);")


def main():
    driver, profile = browser()
    try:
        run(driver)
    except BaseException:
        path = os.path.join(args["screenshots"], "dashboard-failure.png")
        driver.save_screenshot(path)
        print(f"dashboard: screenshot of the failure: {path}", flush=True)
        for entry in driver.get_log("browser"):
            print(f"dashboard: browser console: {entry}", flush=True)
        raise
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def run(driver):
    # Nothing but the shell without a token: the page asks for one.
    driver.get(args["url"])
    wait(driver, lambda d: d.find_element(By.ID, "token").is_displayed(), "the page asks for a token")
    assert not driver.find_element(By.ID, "board").is_displayed()
    step("the page asks for a token")

    sign_in(driver, args["tokens"]["alice"])
    for task in [args["stream"], args["victim"], args["quick"], args["ticker"]]:
        wait(driver, lambda d, t=task: row(d, t) is not None, f"row {task} appears")
    wait(driver, lambda d: status_of(d, args["quick"]) == "completed", f"{args['quick']} settles as completed")
    assert status_of(driver, args["victim"]) == "running", status_of(driver, args["victim"])
    assert args["bob_task"] not in ids_shown(driver), ids_shown(driver)
    step("as alice: rows appear and settle")

    # Output streams in live, and reading it here does not consume it.
    act(driver, lambda d: row(d, args["stream"]).click(), f"{args['stream']} is selected")
    pane = driver.find_element(By.ID, "output")
    wait(driver, lambda d: "first-line" in pane.text, "first-line shows in the output pane")
    assert "second-line" not in pane.text
    with open(args["go_file"], "w") as go:
        go.write("go\n")
    wait(driver, lambda d: "second-line" in pane.text, "second-line streams in")
    wait(driver, lambda d: status_of(d, args["stream"]) == "completed", f"{args['stream']} completes")
    step("as alice: output lines stream in")

    # Kill from the page: the same reply as task_kill.
    victim = args["victim"]
    act(driver, lambda d: row(d, victim).find_element(By.CSS_SELECTOR, "[data-action='kill']").click(),
        f"the kill button of {victim} is clicked")
    message = driver.find_element(By.ID, "message")
    wait(driver, lambda d: message.text == f"requested cancellation of task {victim}", "the kill reply shows")
    wait(driver, lambda d: status_of(d, victim) == "killed", f"{victim} shows as killed")
    step("as alice: killed from the page")

    # A plugin reload: rewrite the file `serve --watch` watches.
    ticker_version = wait(driver, lambda d: row(d, args["ticker"]).find_element(By.CSS_SELECTOR, "td.version").text,
                          "the ticker task's version shows")
    assert ticker_version.endswith(" v1"), ticker_version
    plugin_row = 'tr[data-plugin="ticker"]'
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, plugin_row).get_attribute("data-serving").endswith(" v1"),
         "the ticker plugin shows v1")
    with open(args["plugin_v2"], "rb") as source:
        v2 = source.read()
    with open(args["plugin"], "wb") as target:
        target.write(v2)
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, plugin_row).get_attribute("data-serving").endswith(" v2"),
         "the ticker plugin shows v2")
    reload_text = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"{plugin_row} td.reload").text,
                       "the reload result shows")
    assert "reloaded ticker: v2 serving new starts; 1 task still on v1" in reload_text, reload_text
    step(f"plugin reload shown: {reload_text}")

    path = os.path.join(args["screenshots"], "dashboard-alice.png")
    driver.save_screenshot(path)
    step(f"screenshot: {path}")

    # bob sees none of alice's tasks.
    sign_out(driver)
    sign_in(driver, args["tokens"]["bob"])
    wait(driver, lambda d: row(d, args["bob_task"]) is not None, "bob's own task shows")
    assert owners_shown(driver) == {"bob"}, owners_shown(driver)
    step("as bob: none of alice's tasks")

    # admin sees both owners, grouped.
    sign_out(driver)
    sign_in(driver, args["tokens"]["admin"])
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tbody[data-owner="alice"] tr[data-task-id]')
         and d.find_elements(By.CSS_SELECTOR, 'tbody[data-owner="bob"] tr[data-task-id]'),
         "the admin sees alice's and bob's groups")
    assert {"alice", "bob"} <= owners_shown(driver), owners_shown(driver)
    path = os.path.join(args["screenshots"], "dashboard-admin.png")
    driver.save_screenshot(path)
    step(f"as admin: both owners; screenshot: {path}")
    print("dashboard: all browser checks passed", flush=True)


if __name__ == "__main__":
    main()
