"""The real UI in headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

Loads the app, clones a voice from an uploaded espeak-ng clip, speaks with it and watches audio
arrive on the WebRTC connection (`getStats` inbound audio). Screenshots of every tab are written to
$TTS_SCREENSHOTS (default: the test's tmp folder) for people to look at.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic", "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
CAPTURE_PCS = """(() => { const Original = window.RTCPeerConnection; window.__pcs = [];
  function Wrapped(...args) { const pc = new Original(...args); window.__pcs.push(pc); return pc; }
  Wrapped.prototype = Original.prototype; Object.setPrototypeOf(Wrapped, Original);
  window.RTCPeerConnection = Wrapped; })();"""
INBOUND_AUDIO = """async () => { const pc = window.__pcs.at(-1); if (!pc) return null;
  const out = {state: pc.connectionState, received: 0, concealed: 0, energy: 0};
  (await pc.getStats()).forEach(s => { if (s.type === 'inbound-rtp' && s.kind === 'audio') {
    out.received = s.totalSamplesReceived || 0; out.concealed = s.concealedSamples || 0;
    out.energy = s.totalAudioEnergy || 0; } });
  return out; }"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TTS_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_clone_and_speak_in_the_browser(live_app, reference_clip, shots, capsys):
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("Debian's chromium is required (apt-get install chromium); .ci/run installs it")
    from playwright.async_api import async_playwright

    async def scenario():
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.add_init_script(CAPTURE_PCS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(live_app + "/")
            speak = page.get_by_role("button", name="Speak", exact=True)
            await speak.wait_for(timeout=60_000)
            await page.screenshot(path=str(shots / "tab_speak.png"), full_page=True)

            # Bad input gets a visible message.
            await page.get_by_label("Text").fill("   ")
            await speak.click()
            await page.get_by_text("text is empty").first.wait_for(timeout=30_000)
            await page.screenshot(path=str(shots / "speak_empty_text_error.png"), full_page=True)

            # Clone a voice from the uploaded clip.
            await page.get_by_role("tab", name="Clone a voice").click()
            upload = page.locator("input[type=file]").first
            await upload.set_input_files(str(reference_clip))
            await page.get_by_label("Transcript of the clip (optional)").fill(
                "The quick brown fox jumps over the lazy dog.")
            await page.get_by_label("Voice name").fill("browser-fox")
            await page.get_by_role("button", name="Create voice").click()
            await page.get_by_text("Saved voice").wait_for(timeout=120_000)
            await page.screenshot(path=str(shots / "tab_clone.png"), full_page=True)

            await page.get_by_role("tab", name="Voices").click()
            await page.locator("table").get_by_text("browser-fox", exact=True).first.wait_for(timeout=30_000)
            await page.screenshot(path=str(shots / "tab_voices.png"), full_page=True)

            await page.get_by_role("tab", name="API").click()
            await page.get_by_text("OpenAI-compatible speech").wait_for(timeout=30_000)
            await page.screenshot(path=str(shots / "tab_api.png"), full_page=True)

            # Speak with the new voice (create_voice selected it) and watch the WebRTC track.
            await page.get_by_role("tab", name="Speak").click()
            await page.get_by_label("Text").fill("Hello from the browser test.")
            voice_box = page.get_by_label("Voice", exact=True).first
            assert await voice_box.input_value() == "browser-fox"
            clicked = time.perf_counter()
            await speak.click()
            first_audio, stats = None, None
            while time.perf_counter() - clicked < 90:
                stats = await page.evaluate(INBOUND_AUDIO)
                if stats and stats["received"] - stats["concealed"] > 0 and stats["energy"] > 0:
                    if first_audio is None:
                        first_audio = time.perf_counter() - clicked
                    if stats["received"] - stats["concealed"] > 48_000:   # a second of real audio
                        break
                await asyncio.sleep(0.05)
            await page.get_by_text("Time to first audio").wait_for(timeout=60_000)   # the live metric
            await page.screenshot(path=str(shots / "tab_speak_playing.png"), full_page=True)
            await browser.close()
            return first_audio, stats, errors

    first_audio, stats, errors = asyncio.run(scenario())
    with capsys.disabled():
        print(f"\n[browser] click -> first audio {first_audio and round(1000 * first_audio)} ms; stats {stats}; "
              f"screenshots in {shots}")
    assert first_audio is not None, f"no audio arrived over WebRTC: {stats}"
    assert stats["received"] - stats["concealed"] > 48_000 and stats["energy"] > 0
    assert not errors, errors
