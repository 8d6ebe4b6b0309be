"""TF32 / float32 matmul precision captured and put back through whichever API the user set it with.

Since torch 2.9 there are two APIs: the legacy getters raise ("mix of the legacy and new APIs")
while an fp32_precision setting disagrees with them, and torch's initial cuDNN conv/rnn value
cannot be written back once overwritten. Both are process-wide, so each scenario runs in a fresh
interpreter and cannot leave the other tests a torch whose getters raise.
"""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

import torchmagic.core.settings as settings_module
from torchmagic.core.devices import CpuDevice
from torchmagic.core.settings import Fp32Precision, TorchSettings, tf32_enabled
from torchmagic.features.compare.variants import Env, parse_variants

_BACKENDS = torch.backends
_SHOWN = {  # everything either API shows the user
    "fp32_precision": lambda: _BACKENDS.fp32_precision,
    "cuda.matmul": lambda: _BACKENDS.cuda.matmul.fp32_precision,
    "cudnn": lambda: _BACKENDS.cudnn.fp32_precision,
    "cudnn.conv": lambda: _BACKENDS.cudnn.conv.fp32_precision,
    "cudnn.rnn": lambda: _BACKENDS.cudnn.rnn.fp32_precision,
    "mkldnn": lambda: _BACKENDS.mkldnn.fp32_precision,
    "mkldnn.matmul": lambda: _BACKENDS.mkldnn.matmul.fp32_precision,
    "get_float32_matmul_precision": torch.get_float32_matmul_precision,
    "cuda.matmul.allow_tf32": lambda: _BACKENDS.cuda.matmul.allow_tf32,
    "cudnn.allow_tf32": lambda: _BACKENDS.cudnn.allow_tf32,
}


def shown() -> dict:
    readings = {}
    for name, read in _SHOWN.items():
        try:
            readings[name] = read()
        except RuntimeError as exc:
            assert "mix of the legacy and new APIs" in str(exc)
            readings[name] = "raises"
        except AttributeError:  # torch before 2.9: no fp32_precision attributes
            pass
    return readings


new_api = pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"),
                             reason="torch before 2.9 has only the legacy TF32 API")


def in_fresh_python(scenario):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(scenario).result()


def _tf32_variant():
    return parse_variants("tf32")[1], Env(CpuDevice(), torch.bfloat16)


def _conv_after_cudnn_ieee():
    """What cuDNN convolutions read once their parent is set, in an interpreter where nothing was
    restored (torch 2.13: they follow it; 2.11: they keep their own "tf32")."""
    _BACKENDS.cuda.matmul.fp32_precision = "tf32"
    _BACKENDS.cudnn.fp32_precision = "ieee"
    return _BACKENDS.cudnn.conv.fp32_precision


def _new_api_then_restore():
    _BACKENDS.cuda.matmul.fp32_precision = "tf32"
    before = shown()
    assert before["get_float32_matmul_precision"] == before["cuda.matmul.allow_tf32"] == "raises"
    saved = TorchSettings.capture()
    torch.set_float32_matmul_precision("medium")  # the measured code changes both APIs
    _BACKENDS.fp32_precision = "ieee"
    _BACKENDS.cuda.matmul.fp32_precision = "none"
    saved.restore()
    assert shown() == before and TorchSettings.capture() == saved
    _BACKENDS.cudnn.fp32_precision = "ieee"  # what defers still follows its parent
    assert _BACKENDS.cuda.matmul.fp32_precision == "tf32"
    return _BACKENDS.cudnn.conv.fp32_precision


@new_api
def test_capture_and_restore_after_the_new_api_was_used():
    assert in_fresh_python(_new_api_then_restore) == in_fresh_python(_conv_after_cudnn_ieee)


def _torchs_initial_cudnn_value_overwritten():
    _BACKENDS.fp32_precision = "ieee"
    before = shown()
    saved = TorchSettings.capture()
    _BACKENDS.cudnn.allow_tf32 = False  # writes conv and rnn: torch's initial value is gone for good
    saved.restore()
    assert shown() == before
    _BACKENDS.fp32_precision = "tf32"  # they still follow what is set above them
    assert _BACKENDS.cudnn.conv.fp32_precision == _BACKENDS.cudnn.rnn.fp32_precision == "tf32"


@new_api
def test_an_overwritten_initial_cudnn_value_comes_back_as_what_reads_the_same():
    in_fresh_python(_torchs_initial_cudnn_value_overwritten)


def _legacy_api_then_restore():
    torch.set_float32_matmul_precision("high")
    _BACKENDS.cudnn.allow_tf32 = False
    before = shown()
    saved = TorchSettings.capture()
    _BACKENDS.cuda.matmul.fp32_precision = "ieee"  # the measured code uses the new API
    _BACKENDS.cudnn.conv.fp32_precision = "tf32"
    assert shown()["cuda.matmul.allow_tf32"] == shown()["cudnn.allow_tf32"] == "raises"
    saved.restore()
    assert shown() == before and before["get_float32_matmul_precision"] == "high" and not before["cudnn.allow_tf32"]


@new_api  # the measured code then uses the new one
def test_capture_and_restore_after_the_legacy_api_was_used():
    in_fresh_python(_legacy_api_then_restore)


def _tf32_variant_after_the_new_api():
    _BACKENDS.cudnn.fp32_precision = "ieee"  # cuda.all: matmul, conv and rnn all defer to it
    _BACKENDS.mkldnn.matmul.fp32_precision = "bf16"
    before = shown()
    variant, env = _tf32_variant()
    with variant.around_call(None, env):
        inside = shown()
    assert inside["cuda.matmul"] == inside["cudnn.conv"] == inside["cudnn.rnn"] == "tf32"
    assert (inside["get_float32_matmul_precision"], inside["cuda.matmul.allow_tf32"], inside["cudnn.allow_tf32"]) \
        == ("high", True, True)  # both APIs agree inside: no getter raises there
    assert shown() == before
    # conv and rnn still hold torch's initial value, which no setter can write: TF32 once nothing is set above
    _BACKENDS.cudnn.fp32_precision = "none"
    assert _BACKENDS.cudnn.conv.fp32_precision == _BACKENDS.cudnn.rnn.fp32_precision == "tf32"


@new_api
def test_tf32_variant_after_the_new_api_was_used():
    in_fresh_python(_tf32_variant_after_the_new_api)


def _tf32_variant_after_the_legacy_api():
    torch.set_float32_matmul_precision("medium")
    _BACKENDS.cudnn.allow_tf32 = False
    before = shown()
    variant, env = _tf32_variant()
    try:
        with variant.around_call(None, env):
            assert shown()["get_float32_matmul_precision"] == "high" and _BACKENDS.cudnn.allow_tf32
            raise KeyboardInterrupt  # the user's code is interrupted halfway
    except KeyboardInterrupt:
        pass
    assert shown() == before and torch.get_float32_matmul_precision() == "medium"


def test_tf32_variant_after_the_legacy_api_was_used():
    in_fresh_python(_tf32_variant_after_the_legacy_api)


def _torch_without_the_new_api():
    settings_module._get_fp32 = settings_module._set_fp32 = None  # as on torch < 2.9
    torch.set_float32_matmul_precision("medium")
    saved = Fp32Precision.capture()
    assert saved == Fp32Precision("medium", True, ())
    with tf32_enabled():
        assert torch.get_float32_matmul_precision() == "high" and _BACKENDS.cudnn.allow_tf32
        _BACKENDS.cudnn.allow_tf32 = False
    assert Fp32Precision.capture() == saved


def test_torch_without_the_new_api_uses_the_legacy_one():
    in_fresh_python(_torch_without_the_new_api)


def _amp_compare_after_the_new_api():
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    shell.run_cell("import torch\ntorch.backends.cuda.matmul.fp32_precision = 'tf32'")
    before = shown()
    with capture_output():
        result = shell.run_cell("%%amp_compare --variants eager,tf32 --runs 2 --min-time 0.01 --warmup 0 -o r\n"
                                "x = torch.randn(16, 16)\nx @ x")
    assert result.success, result.error_in_exec
    assert shell.user_ns["r"]["tf32"].ok and result.result.shape == (16, 16)
    assert shown() == before


@new_api
def test_amp_compare_after_the_new_api_works_and_leaves_the_settings():
    in_fresh_python(_amp_compare_after_the_new_api)
