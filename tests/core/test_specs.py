"""gpulab.core.specs: architecture table, datasheet lookup, PCIe peaks."""
import dataclasses

import pytest

from gpulab.core import specs


# -- architecture -------------------------------------------------------------
def test_known_capabilities():
    assert specs.architecture(6, 1) == ("Pascal", None)
    assert specs.architecture(7, 0) == ("Volta", 1)
    assert specs.architecture(7, 5) == ("Turing", 2)
    assert specs.architecture(8, 6) == ("Ampere", 3)
    assert specs.architecture(8, 9) == ("Ada Lovelace", 4)
    assert specs.architecture(9, 0) == ("Hopper", 4)
    assert specs.architecture(10, 0) == ("Blackwell", 5)


def test_unknown_minor_is_named_after_its_major():
    assert specs.architecture(9, 5) == ("Hopper (unrecognised sm_95)", 4)
    assert specs.architecture(12, 7) == ("Blackwell (unrecognised sm_127)", 5)


def test_unknown_newer_major_counts_as_newer_than_blackwell():
    assert specs.architecture(15, 0) == ("newer than Blackwell (unrecognised sm_150)", 5)


def test_unknown_older_major_has_no_tensor_cores():
    assert specs.architecture(2, 1) == ("older than Kepler (unrecognised sm_21)", None)


def test_tensor_core_generation_never_goes_down_with_capability():
    gens = [specs.ARCHITECTURES[cc][1] or 0 for cc in sorted(specs.ARCHITECTURES)]
    assert gens == sorted(gens)


# -- datasheets -----------------------------------------------------------------
def test_datasheet_for_h100_sxm_name_as_torch_reports_it():
    sheet = specs.datasheet_for("NVIDIA H100 80GB HBM3")
    assert sheet.model == "H100 SXM"
    assert (sheet.bf16, sheet.mem_gbps) == (989, 3350)


@pytest.mark.parametrize("device_name, model", [
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
])
def test_more_specific_names_win(device_name, model):
    assert specs.datasheet_for(device_name).model == model


def test_datasheet_lookup_ignores_case():
    assert specs.datasheet_for("nvidia h100 pcie").model == "H100 PCIe"


def test_every_entry_is_found_by_its_own_name():
    for entry in specs.DATASHEETS:
        assert specs.datasheet_for(f"NVIDIA {entry.match}") is entry, entry.match


def test_unknown_gpu_has_no_datasheet():
    assert specs.datasheet_for("NVIDIA GeForce GTX 1080") is None
    assert specs.datasheet_for("Some Future GPU 9000") is None


def test_l40_is_not_mistaken_for_an_l4():
    sheet = specs.datasheet_for("NVIDIA L40")
    assert sheet is None or sheet.model != "L4"


def test_datasheet_figures_are_consistent():
    for s in specs.DATASHEETS:
        assert s.fp32 > 0 and s.mem_gbps > 0, s.model
        # Tensor Core rates are at least the CUDA-core fp32 rate, fp8 at least bf16
        for tc in (s.tf32, s.fp16, s.bf16):
            assert tc is None or tc >= s.fp32, s.model
        assert s.fp8 is None or s.fp8 >= s.bf16, s.model


def test_datasheet_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs.DATASHEETS[0].fp32 = 1.0


# -- PCIe -----------------------------------------------------------------------
def test_pcie_peaks():
    assert specs.pcie_peak_gbps(4, 16) == pytest.approx(31.504)
    assert specs.pcie_peak_gbps(3, 16) == pytest.approx(15.76)
    assert specs.pcie_peak_gbps(5, 8) == pytest.approx(31.504)
    assert specs.pcie_peak_gbps(1, 1) == pytest.approx(0.25)


def test_pcie_unknown_generation_is_none():
    assert specs.pcie_peak_gbps(7, 16) is None
    assert specs.pcie_peak_gbps(0, 16) is None
