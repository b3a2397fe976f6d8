"""Test-wide settings, and fixtures more than one test file uses."""

import os
import shutil

import pytest
import torch

# transformers' load reports and progress bars are noise in test output.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# pytest-xdist's workers share the cores: each takes its share of torch's threads. With every worker on all cores,
# a tiny model's operations wait at OpenMP's barriers for a thread another worker has descheduled (40 Adam steps of
# a 2-layer model: 0.4 s alone, 36 s in the whole suite on 2 cores).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# The files that take longest (whole suite, 2 workers), longest first. pytest-xdist's loadfile hands out the files
# with the most tests first, which left these (a few slow tests each) to the end, one worker busy with them while
# the other sat idle.
LONGEST_FILES = ("tests/models/test_compiled.py", "tests/corpus/test_resume.py",
                 "tests/analysis/test_lens_tutorials.py", "tests/dictionaries/test_features_memory.py",
                 "tests/docs/test_readme.py", "tests/dictionaries/test_features.py", "tests/corpus/test_memory.py",
                 "tests/corpus/test_distributed.py", "tests/docs/test_tutorial.py")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it, plain pytest runs
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, the longest files first (LONGEST_FILES), then xdist's own order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            for path in reversed(LONGEST_FILES):  # those still waiting to the front of the queue, longest first
                for scope in [scope for scope in self.workqueue if scope.endswith(path)]:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFilesFirst(config, log)


def pytest_collection_modifyitems(items):
    """A test that drives the browser is slow (pyproject's `slow` marker), wherever it is."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A random GPT-2 with a byte-level BPE tokenizer trained on the spot (no GPT-2 tokenizer is local)."""
    import transformers

    from helpers import byte_level_bpe, randomize_

    directory = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = byte_level_bpe(["The meaning of life is to learn.", "Once upon a time there lived a cat."] * 5, 300)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(directory)
    config = transformers.GPT2Config(vocab_size=len(fast), n_positions=64, n_embd=48, n_layer=2, n_head=3,
                                     bos_token_id=0, eos_token_id=0)
    reference = randomize_(transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager"), 0.3)
    reference.save_pretrained(directory)
    return directory, fast, reference.eval()


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by selenium; the test skips, saying why, when either is missing."""
    missing = [exe for exe in ("chromium", "chromedriver") if shutil.which(exe) is None]
    if missing:
        pytest.skip(f"not on PATH: {', '.join(missing)}")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    yield driver
    driver.quit()


@pytest.fixture
def one_thread():
    """Tiny models on one thread: their matrices are too small to share, and on a busy machine two threads spend
    most of a forward pass waiting for each other (1 ms against up to 100 ms). Results are compared within a test,
    so the thread count changes no verdict."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
