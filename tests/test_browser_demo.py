"""The browser demo the way people use it (issue 11), in headless Chromium against the live app.

Speak / let it finish / Speak / Stop / Speak, five times on one page; Stop silences the track at once;
voice lists follow API clones and deletes; one message per mistake, without server paths; fastrtc's
unused websocket and telephone routes are not served; SIGTERM closes the engine and removes the temp
folders. Audio is measured in the browser as `getStats()` inbound audio `totalSamplesReceived -
concealedSamples` (48 kHz), per RTCPeerConnection (every Speak opens a new one), sampled every 25 ms by
an init script so the count survives the connection's close. Screenshots of each state go to
$TTS_SCREENSHOTS (default: a tmp folder).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REFERENCE_TEXT, ROOT, free_port
from tests.test_browser import ARGS, CHROMIUM

SR = 48_000                     # Chrome counts received audio at 48 kHz
# Random weights sometimes emit EOS early (of seeds 0-11 for the default text, seed 4 stopped at 7.4 of 10 s),
# which made an utterance shorter than the test expects now and then: these tests speak with a seed whose
# utterance runs to the length limit.
FULL_LENGTH_SEED = 1
# 0.3 s of audio may still count after Stop: the page ends the received track at the click (app.py SILENCE_NOW),
# and the 25 ms stats poll lags the click (0.07-0.11 s alone; 0.23-0.33 s before the page did that, when the
# jitter buffer and the Stop request's round trip played on)
AFTER_STOP_LIMIT = 14_400
# Every RTCPeerConnection the page makes, with the most real audio (received - concealed) it has had.
CAPTURE_AUDIO = """(() => { const Original = window.RTCPeerConnection; window.__pcs = [];
  function Wrapped(...args) { const pc = new Original(...args); pc.__real = 0; window.__pcs.push(pc); return pc; }
  Wrapped.prototype = Original.prototype; Object.setPrototypeOf(Wrapped, Original);
  window.RTCPeerConnection = Wrapped;
  setInterval(async () => { for (const pc of window.__pcs) { if (pc.connectionState === 'closed') continue;
    try { (await pc.getStats()).forEach(s => { if (s.type === 'inbound-rtp' && s.kind === 'audio')
      { pc.__real = Math.max(pc.__real, (s.totalSamplesReceived || 0) - (s.concealedSamples || 0));
        pc.__jbMs = s.jitterBufferEmittedCount ? 1000 * s.jitterBufferDelay / s.jitterBufferEmittedCount : 0; } });
    } catch (e) {} } }, 25);
  // The audio count of every connection when a Stop click reaches the page (Playwright's own click takes
  // 100-300 ms on a loaded 2-core machine, during which audio rightly keeps playing).
  document.addEventListener('click', (e) => { const b = e.target.closest && e.target.closest('button');
    if (b && b.innerText.trim() === 'Stop') window.__atStop = window.__pcs.map(pc => pc.__real); }, true); })();"""
# (jb_ms: the mean time a sample waited in the browser's jitter buffer so far: audio there at Stop still plays)
PCS = "() => window.__pcs.map(pc => ({real: pc.__real, state: pc.connectionState, jb_ms: pc.__jbMs || 0}))"
STATUS_RE = r"Press|Starting|playing|Finished|RTF|Stopped|Nothing is playing|failed"
STATUS = """(pattern) => { const re = new RegExp(pattern);
  const el = [...document.querySelectorAll('.prose')].find(e => re.test(e.innerText));
  return el ? el.innerText.trim() : null; }"""
TOASTS = "() => [...document.querySelectorAll('.toast-body')].filter(e => e.offsetParent !== null).map(e => e.innerText)"
# The WebRTC component's wave visualiser: drawn paths and whether they are still changing.
WAVE = "() => [...document.querySelectorAll('.wave-path')].map(p => p.getAttribute('d')).join('|')"


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TTS_SCREENSHOTS") or tmp_path_factory.mktemp("demo_screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _need_chromium() -> None:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("Debian's chromium is required (apt-get install chromium); .ci/run installs it")


def run(coro, limit_s: float):
    """Every browser scenario is bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, limit_s))


async def until(probe, what: str, limit_s: float, every_s: float = 0.05, seen=None):
    """Poll `probe()` (async) until it returns something truthy; fail naming `what` after `limit_s`, with what
    `seen()` (async, optional) says the page shows then (these waits time out rarely; the note says which)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = f"; {await seen()}" if seen is not None else ""
            raise AssertionError(f"timed out after {limit_s:.0f} s waiting for {what}{shown}")
        await asyncio.sleep(every_s)   # polling interval of a state wait, not a stand-in for one


class DemoPage:
    """The Speak tab of one page, with its audio counted per connection."""

    def __init__(self, page, url: str):
        self.page, self.url = page, url
        self.speak = page.get_by_role("button", name="Speak", exact=True)
        self.stop = page.get_by_role("button", name="Stop", exact=True)

    @classmethod
    async def open(cls, browser, url: str, max_seconds: int | None = None, seed: int | None = None) -> "DemoPage":
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.add_init_script(CAPTURE_AUDIO)
        await page.goto(url + "/")
        self = cls(page, url)
        await self.speak.wait_for(timeout=60_000)
        if max_seconds is not None:   # short utterances: random weights rarely stop by themselves
            await page.get_by_text("Advanced sampling").click()
            box = page.get_by_label("number input for Max length (s)")
            await box.fill(str(max_seconds))
            await box.press("Enter")
            if seed is not None:
                seed_box = page.get_by_label("Seed (-1: random)")
                await seed_box.fill(str(seed))
                await seed_box.press("Enter")
            await page.get_by_text("Advanced sampling").click()
        return self

    async def pcs(self) -> list[dict]:
        return await self.page.evaluate(PCS)

    async def status(self) -> str:
        return await self.page.evaluate(STATUS, STATUS_RE) or ""

    async def wait_status(self, pattern: str, limit_s: float = 30) -> str:
        async def probe():
            text = await self.status()
            return text if re.search(pattern, text) else None
        try:
            return await until(probe, f"status /{pattern}/", limit_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the status says {await self.status()!r}") from None

    async def click_speak(self) -> int:
        """Speak; returns the index of the connection it opens."""
        before = len(await self.pcs())
        await self.speak.click()
        await until(lambda: self._more_pcs(before), "a new WebRTC connection after Speak", 30, seen=self.shows)
        return before

    async def _more_pcs(self, n: int) -> bool:
        return len(await self.pcs()) > n

    async def real(self, index: int) -> int:
        return (await self.pcs())[index]["real"]

    async def wait_audio(self, index: int, samples: int, limit_s: float = 30) -> int:
        async def probe():
            real = await self.real(index)
            return real if real >= samples else None
        return await until(probe, f"{samples / SR:.2f} s of audio on connection {index}", limit_s, seen=self.shows)

    async def shows(self) -> str:
        """What the page shows: its status, its messages and its connections (for a wait's failure)."""
        return f"the status says {await self.status()!r}, messages {await self.page.evaluate(TOASTS)}, " \
               f"connections {await self.pcs()}"

    async def settled(self, index: int, quiet_s: float = 1.0, limit_s: float = 30) -> int:
        """The connection's audio count once it has stopped growing for `quiet_s` (or it closed)."""
        last, since = await self.real(index), time.monotonic()
        deadline = time.monotonic() + limit_s
        while time.monotonic() - since < quiet_s:
            pc = (await self.pcs())[index]
            if pc["real"] != last:
                last, since = pc["real"], time.monotonic()
            elif pc["state"] == "closed":
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"audio on connection {index} still growing after {limit_s:.0f} s")
            await asyncio.sleep(0.025)
        return last

    async def click_stop(self, index: int) -> int:
        """Stop; returns the connection's audio count when the click reached the page."""
        await self.page.evaluate("() => { window.__atStop = null; }")
        await self.stop.click()
        return (await self.page.evaluate("() => window.__atStop"))[index]

    async def wave_moving(self) -> bool:
        """Whether the WebRTC component still animates its wave (two reads 200 ms apart differ)."""
        first = await self.page.evaluate(WAVE)
        await asyncio.sleep(0.2)   # two samples of an animation, by definition some time apart
        return bool(first) and first != await self.page.evaluate(WAVE)

    async def shot(self, folder: Path, name: str) -> None:
        await self.page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


async def engine_state(url: str) -> dict | None:
    """Per-request state each engine part holds (counts), from GET /healthz ("held"); None if not served."""
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(url + "/healthz")
    return r.json().get("held") if r.status_code == 200 else None


async def engine_idle(url: str) -> dict | None:
    state = await engine_state(url)
    assert state is not None, "GET /healthz does not report what the engine holds"
    return state if not any(state.values()) else None


async def _browser(p):
    return await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)


# ---- 1. the cycle, five times on one page -----------------------------------------------------------
def test_speak_finish_speak_stop_speak_five_times(live_app, shots, capsys, tmp_path_factory):
    _need_chromium()
    from playwright.async_api import async_playwright

    log: list[str] = []

    async def speak_to_the_end(demo: DemoPage, step: str, shoot: bool):
        pc = await demo.click_speak()
        await demo.wait_audio(pc, SR // 2)
        await demo.wait_status("playing…")
        if shoot:
            await demo.shot(shots, "playing")
        status = await demo.wait_status(r"RTF", limit_s=30)          # the final status
        assert "playing" not in status, status
        heard = await demo.settled(pc)
        assert heard >= 2 * SR, f"{step}: only {heard / SR:.2f} s of a 3 s utterance arrived"
        assert await demo.page.get_by_text("Uploading").count() == 0, f"{step}: 'Uploading…' rows in the download box"
        await until(lambda: _closed(demo, pc), f"{step}: the connection to close after the utterance", 10,
                    seen=demo.shows)
        assert not await demo.wave_moving(), f"{step}: the waveform still moves after the audio ended"
        if shoot:
            await demo.shot(shots, "finished")
        log.append(f"{step}: {heard / SR:.2f} s, status {status[:40]!r} ... {status[-32:]!r}")

    async def speak_then_stop(demo: DemoPage, step: str, shoot: bool):
        pc = await demo.click_speak()
        await demo.wait_audio(pc, SR // 2)
        await demo.wait_status("playing…")
        at_stop = await demo.click_stop(pc)
        jitter_ms = (await demo.pcs())[pc]["jb_ms"]
        await demo.wait_status(r"Stopped", limit_s=10)
        after = await demo.settled(pc) - at_stop
        assert after < AFTER_STOP_LIMIT, \
            f"{step}: {after / SR:.2f} s of audio arrived after Stop (jitter buffer mean {jitter_ms:.0f} ms)"
        await until(lambda: _closed(demo, pc), f"{step}: the connection to close after Stop", 10, seen=demo.shows)
        assert not await demo.wave_moving(), f"{step}: the waveform still moves after Stop"
        if shoot:
            await demo.shot(shots, "stopped")
        log.append(f"{step}: {after / SR:.3f} s after Stop (jitter buffer mean {jitter_ms:.0f} ms)")

    async def scenario():
        async with async_playwright() as p:
            browser = await _browser(p)
            demo = await DemoPage.open(browser, live_app, max_seconds=3, seed=FULL_LENGTH_SEED)
            errors: list[str] = []
            demo.page.on("pageerror", lambda exc: errors.append(str(exc)))
            await demo.shot(shots, "idle")
            for round_ in range(5):
                await speak_to_the_end(demo, f"round {round_ + 1} speak", shoot=round_ == 0)
                await speak_then_stop(demo, f"round {round_ + 1} speak+stop", shoot=round_ == 0)
                await speak_to_the_end(demo, f"round {round_ + 1} speak again", shoot=False)
                assert not errors, errors
            await browser.close()

    try:
        run(scenario(), 600)
    finally:
        with capsys.disabled():
            print("\n[demo cycle] " + "\n[demo cycle] ".join(log))
    # Ending 15 UI streams logged no aiortc traceback ("'NoneType' object has no attribute 'pts'"), and no
    # offer met a per-session copy of the WebRTC component ("... no attribute '_clear_queue'").
    app_log = "".join(f.read_text() for f in tmp_path_factory.getbasetemp().glob("live_app*/app.log"))
    assert "attribute 'pts'" not in app_log and "_clear_queue" not in app_log, app_log[-3000:]


async def _closed(demo: DemoPage, index: int) -> bool:
    return (await demo.pcs())[index]["state"] == "closed"


# ---- 2. Stop silences the track at once and frees the engine ----------------------------------------
def test_stop_silences_at_once_and_frees_the_engine(live_app, capsys):
    _need_chromium()
    from playwright.async_api import async_playwright

    results: dict[str, float | str] = {}
    served = False

    async def scenario():
        nonlocal served
        async with async_playwright() as p:
            browser = await _browser(p)
            demo = await DemoPage.open(browser, live_app, max_seconds=10, seed=FULL_LENGTH_SEED)
            served = await engine_state(live_app) is not None

            # a) Stop while the engine is still generating.
            pc = await demo.click_speak()
            await demo.wait_audio(pc, SR)                  # one second has played
            if served:
                assert await engine_idle(live_app) is None, "expected the request to be running"
            at_stop = await demo.click_stop(pc)
            results["during generation"] = (await demo.settled(pc) - at_stop) / SR
            results["status after Stop (a)"] = await demo.status()
            if served:
                await until(lambda: engine_idle(live_app), "the engine to free the aborted request", 10)

            # b) Stop after generation has finished, while the queued audio still plays.
            pc = await demo.click_speak()
            await demo.wait_audio(pc, SR // 2)
            if served:
                await until(lambda: engine_idle(live_app), "generation to finish", 60)
            else:   # without the engine's counts: 10 s of audio are generated at RTF ~0.6 (tiny model, 2 cores)
                await demo.wait_audio(pc, 7 * SR)
            assert await demo.real(pc) < 9 * SR, "the utterance had nearly finished playing: nothing left to stop"
            results["status before Stop (b)"] = await demo.status()
            at_stop = await demo.click_stop(pc)
            results["after generation"] = (await demo.settled(pc) - at_stop) / SR
            results["status after Stop (b)"] = await demo.status()
            results["played before Stop (b)"] = at_stop / SR
            await browser.close()

    _run_and_report(scenario(), 240, capsys, "stop", results)
    assert results["during generation"] < AFTER_STOP_LIMIT / SR, results
    assert served, "GET /healthz does not report what the engine holds: cannot tell whether the engine freed the request"
    assert results["after generation"] < AFTER_STOP_LIMIT / SR, results
    assert "Stopped" in results["status after Stop (a)"] and "Stopped" in results["status after Stop (b)"], results
    assert "playing" in results["status before Stop (b)"], results   # generation is over, the sound is not


def test_stop_silences_the_browser_before_the_server_answers(live_app, capsys):
    """The page ends the received audio at the Stop click itself: with the server's answer to Stop held back (every
    queue-less call waits, the track keeps streaming), the audio counted after the click stays under the limit and
    the connection is still open; the held calls then go through and the status says Stopped."""
    _need_chromium()
    from playwright.async_api import async_playwright

    results: dict[str, float | int | str] = {}

    async def scenario():
        async with async_playwright() as p:
            browser = await _browser(p)
            demo = await DemoPage.open(browser, live_app, max_seconds=10, seed=FULL_LENGTH_SEED)
            pc = await demo.click_speak()
            await demo.wait_audio(pc, SR // 2)
            release, held = asyncio.Event(), []

            async def hold(route):
                held.append(route.request.url)
                await release.wait()
                await route.continue_()
            await demo.page.route("**/run/**", hold)
            at_stop = await demo.click_stop(pc)
            await until(lambda: _true(bool(held)), "the Stop call to reach the held route", 10)
            results["after Stop, server not told"] = (await demo.settled(pc) - at_stop) / SR
            results["state then"] = (await demo.pcs())[pc]["state"]
            results["held calls"] = len(held)
            release.set()                                   # the held calls, and any later one, go through
            results["status"] = await demo.wait_status(r"Stopped", limit_s=10)
            await browser.close()

    _run_and_report(scenario(), 120, capsys, "stop, server held", results)
    assert results["after Stop, server not told"] < AFTER_STOP_LIMIT / SR, results
    assert results["state then"] != "closed", results      # the server had not ended the stream meanwhile


async def _true(value: bool) -> bool:
    return value


def _run_and_report(scenario, limit_s: float, capsys, label: str, results: dict) -> None:
    """Run a browser scenario, then print what it measured, whether it passed or not (the figures a failure needs)."""
    try:
        run(scenario, limit_s)
    finally:
        with capsys.disabled():
            print(f"\n[{label}] {results}")


# ---- 3. voice lists follow the library ----------------------------------------------------------------
def test_voice_lists_follow_api_clone_and_delete(live_app, reference_clip, shots):
    _need_chromium()
    from playwright.async_api import async_playwright

    name = "api-voice-11"

    async def lists(demo: DemoPage) -> tuple[list[str], str]:
        box = demo.page.get_by_label("Voice", exact=True).first
        await box.click()
        options = [o.replace("✓", "").strip() for o in await demo.page.locator("ul.options li").all_inner_texts()]
        await box.press("Escape")
        await demo.page.get_by_role("tab", name="Voices").click()
        table = demo.page.locator("table").first
        await table.wait_for()
        text = await table.inner_text()
        await demo.page.get_by_role("tab", name="Speak").click()
        return options, text

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client, async_playwright() as p:
            await client.delete(f"{live_app}/v1/audio/voices/{name}")     # a leftover of an earlier run
            browser = await _browser(p)
            demo = await DemoPage.open(browser, live_app)                 # opened before the clone
            with open(reference_clip, "rb") as f:
                r = await client.post(live_app + "/v1/audio/voices", data={"name": name, "transcript": REFERENCE_TEXT},
                                      files={"file": ("ref.wav", f, "audio/wav")})
            assert r.status_code == 201, r.text
            await demo.page.reload()
            await demo.speak.wait_for()
            options, table = await lists(demo)
            assert name in options, f"Speak dropdown after reload: {options}"
            assert name in table, f"Voices table after reload: {table}"

            r = await client.delete(f"{live_app}/v1/audio/voices/{name}")
            assert r.status_code == 200, r.text
            await demo.page.reload()
            await demo.speak.wait_for()
            options, table = await lists(demo)
            assert name not in options, f"Speak dropdown after delete + reload: {options}"
            assert name not in table, f"Voices table after delete + reload: {table}"
            await browser.close()

    run(scenario(), 240)


# ---- 4. one message per mistake, without server paths -------------------------------------------------
def test_empty_text_and_junk_upload_messages(live_app, shots, tmp_path):
    _need_chromium()
    from playwright.async_api import async_playwright

    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not audio\n" * 200)

    async def scenario():
        async with async_playwright() as p:
            browser = await _browser(p)
            demo = await DemoPage.open(browser, live_app)
            await demo.page.get_by_label("Text").fill("   ")
            await demo.speak.click()
            await until(lambda: _toasts_with(demo, "text is empty"), "the empty-text message", 30, seen=demo.shows)
            await _toast_shown(demo, "text is empty")
            # A second message came from a stream started anyway; watch long enough for one to connect.
            seen: set[str] = set()
            end = time.monotonic() + 3
            while time.monotonic() < end:
                seen.update(await demo.page.evaluate(TOASTS))
                await asyncio.sleep(0.05)
            await demo.shot(shots, "error_empty_text")
            messages = [m for m in seen if "text is empty" in m]
            assert len(messages) == 1, f"expected one message, got {messages}"
            assert await demo.pcs() == [], "a WebRTC stream was started for empty text"

            for close in await demo.page.locator(".toast-close").all():      # dismiss the message
                await close.click()
            await demo.page.get_by_role("tab", name="Clone a voice").click()
            await demo.page.locator("input[type=file]").first.set_input_files(str(junk))
            await demo.page.get_by_label("Voice name").fill("junk")
            await demo.page.get_by_role("button", name="Create voice").click()
            found = await until(lambda: _toasts_with(demo, "reference audio"), "the junk-upload message", 60,
                                seen=demo.shows)
            await _toast_shown(demo, "reference audio")
            await demo.shot(shots, "error_junk_upload")
            await browser.close()
            return found

    found = run(scenario(), 180)
    assert all("/tmp/" not in m and "/gradio/" not in m for m in found), found
    assert any("junk.wav" in m for m in found), found


async def _toast_shown(demo: DemoPage, text: str) -> None:
    """Until the message has faded in (for the screenshot)."""
    await demo.page.wait_for_function("""(text) => [...document.querySelectorAll('.toast-body')].some(
        e => e.innerText.includes(text) && getComputedStyle(e).opacity === '1')""", arg=text, timeout=10_000)


async def _toasts_with(demo: DemoPage, text: str) -> list[str]:
    return [m for m in await demo.page.evaluate(TOASTS) if text in m]


# ---- 5. only the WebRTC route we use is served --------------------------------------------------------
def test_unused_fastrtc_routes_are_not_served(live_app):
    """POST /telephone/incoming is 404 (it was a 500: fastrtc's Twilio webhook). The websocket routes refuse
    the handshake: an unrouted websocket is closed before accept, which uvicorn answers with HTTP 403."""
    import websockets

    async def handshake(path: str) -> str:
        try:
            async with websockets.connect(live_app.replace("http", "ws", 1) + path, open_timeout=10):
                return "accepted"
        except websockets.InvalidStatus as exc:
            return f"refused {exc.response.status_code}"

    for path in ("/websocket/offer", "/telephone/handler"):
        assert run(handshake(path), 30) == "refused 403", path
    with httpx.Client(timeout=10) as client:
        assert client.post(live_app + "/telephone/incoming").status_code == 404
        r = client.post(live_app + "/webrtc/offer", json={})       # still there: a bad body is refused
        assert r.status_code == 400 and r.json()["error"]["code"] == "missing_field", r.text
        spec = client.get(live_app + "/openapi.json").json()["paths"]
        assert "/webrtc/offer" in spec and not any(p.startswith(("/telephone", "/websocket")) for p in spec)


# ---- 6. SIGTERM closes the engine and removes the temp folders ------------------------------------------
def test_sigterm_closes_the_engine_and_removes_temp_folders(tmp_path):
    """Its own app (a private TMPDIR): started twice, stopped with SIGTERM each time."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_TEMP_DIR": str(tmp / "gradio")}

    def start_and_stop(n: int) -> str:
        port, log_path = free_port(), tmp_path / f"app{n}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "app.py", "--demo", "--port", str(port), "--voices", str(tmp_path / "voices"),
                 "--config", str(ROOT / "tests" / "configs" / "app_tiny.yaml")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                deadline = time.monotonic() + 300
                while True:
                    assert proc.poll() is None, "app exited during start-up:\n" + log_path.read_text()[-3000:]
                    assert time.monotonic() < deadline, "app did not start in 300 s"
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(1)   # polling for the server socket
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        text = log_path.read_text()
        assert code == 0, f"exit code {code}:\n{text[-3000:]}"
        assert "stopped" in text, text[-3000:]
        return text

    for n in range(2):
        start_and_stop(n)
        left = sorted(p.name for p in tmp.iterdir() if p.name.startswith("tts_"))
        assert left == ["tts_demo"], f"after start {n + 1}: {left}"
        assert sorted(p.name for p in (tmp / "tts_demo").iterdir()) == ["base-0b6"], "one demo checkpoint, reused"
