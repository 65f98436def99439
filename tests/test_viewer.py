"""`turnforge view`: the byte-offset index, filters and paging, one episode with its loss mask, and the page in a real
headless browser (Debian's chromium + chromium-driver, driven by selenium; skipped where they are not installed)."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from pathlib import Path

import pytest

from turnforge.types import read_trajectories
from turnforge.viewer.episodes import EpisodeFile, episode_view, find_episode_files
from turnforge.viewer.server import Viewer, make_server


def test_a_run_directory_lists_every_stage_and_evaluation(quickstart_run):
    files = find_episode_files(quickstart_run[0])
    assert list(files)[:4] == ["eval/base", "eval/sft", "eval/rft", "eval/grpo"]
    assert "stages/01-collect/trajectories.jsonl" in files and "stages/05-rft/samples" in files
    assert len(files["stages/01-collect/trajectories.jsonl"].rows) == 12


def test_filters_and_pages_on_the_server(quickstart_run):
    viewer = Viewer(quickstart_run[0])
    collect = "stages/01-collect/trajectories.jsonl"
    everything = viewer.page({"source": collect})
    assert everything["total"] == 12 and [r["index"] for r in everything["items"]] == list(range(12))
    category = everything["items"][0]["category"]
    only = viewer.page({"source": collect, "category": category})
    assert 0 < only["total"] < 12 and {r["category"] for r in only["items"]} == {category}
    assert viewer.page({"source": collect, "success": "0"})["total"] == 0  # the expert wins every one
    assert viewer.page({"source": collect, "offset": "10", "limit": "5"})["items"][0]["index"] == 10
    task = everything["items"][3]["task_id"]
    assert [r["index"] for r in viewer.page({"source": collect, "q": task.upper()})["items"]] == [3]
    with pytest.raises(KeyError, match="no episode file 'nope'"):
        viewer.page({"source": "nope"})


def test_an_episode_shows_its_turns_and_the_training_loss_mask(quickstart_run):
    viewer = Viewer(quickstart_run[0])
    traj = read_trajectories(quickstart_run[0] / "eval/sft/episodes.jsonl")[1]
    view = viewer.episode({"source": "eval/sft", "index": "1"})
    assert view["task_id"] == traj.task_id and len(view["messages"]) == len(traj.messages)
    turns = [m["turn"] for m in view["messages"] if "turn" in m]
    assert [t["tokens"] for t in turns] == [len(t.generated_ids) for t in traj.turns]
    (segments,) = view["loss_masks"]
    trained = [s for s in segments if s["train"]]
    # the training rule: every generated token trains, nothing else (episode_pieces drops the last observation)
    assert sum(s["tokens"] for s in trained) == sum(len(t.generated_ids) for t in traj.turns)
    assert sum(s["tokens"] for s in segments) == len(traj.prompt_ids) + sum(
        len(t.generated_ids) + len(t.observation_ids) for t in traj.turns[:-1]) + len(traj.turns[-1].generated_ids)
    assert trained[0]["text"] == traj.turns[0].text  # decoded by the run's tokenizer
    scripted = episode_view(read_trajectories(quickstart_run[0] / "stages/01-collect/trajectories.jsonl")[0])
    assert scripted["loss_masks"] == []  # no token ids: nothing to show without rendering


def test_a_line_cut_short_at_the_end_is_skipped_and_a_bad_line_inside_is_an_error(quickstart_run, tmp_path):
    lines = (quickstart_run[0] / "eval/base/episodes.jsonl").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:3]) + lines[3][:50])
    index = EpisodeFile(cut, "cut")
    assert len(index.rows) == 3 and index.trajectory(2).task_id == json.loads(lines[2])["task_id"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "{not json\n" + lines[1])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a trajectory JSON line"):
        EpisodeFile(bad, "bad")


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1400,1400")


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install 'turnforge[dev]')")
    if not (BROWSER and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def served(quickstart_run):
    server = make_server(Viewer(quickstart_run[0]), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_page_in_a_headless_browser(browser, served, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    rows = lambda: browser.find_elements(By.CSS_SELECTOR, ".episode-row")  # noqa: E731
    browser.get(served)
    wait.until(lambda _: len(rows()) == 6)  # eval/base, the first file
    assert browser.find_element(By.ID, "count").text == "6 episodes match"

    Select(browser.find_element(By.ID, "source")).select_by_value("eval/sft")
    wait.until(lambda _: len(rows()) == 6)
    category = Select(browser.find_element(By.ID, "category"))
    category.select_by_index(1)
    chosen = category.first_selected_option.get_attribute("value")
    wait.until(lambda _: 0 < len(rows()) < 6)  # the filter changed the list
    assert all(chosen in row.text for row in rows())

    rows()[0].click()
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#turns .message"))
    messages = browser.find_elements(By.CSS_SELECTOR, "#turns .message")
    assert any("turn 1: reward" in m.text for m in messages) and "role-system" in messages[0].get_attribute("class")
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#mask .seg.train"))
    assert "tokens train" in browser.find_element(By.ID, "mask").text
    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    with contextlib.suppress(OSError):  # a copy for the person who checks it by eye, where that folder exists
        shutil.copy(shot, Path("/work/wt16-screenshot.png"))
