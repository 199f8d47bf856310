"""Non-GEMM kernels: bytes and launches per family, fused and unfused, derived by hand."""
from simtrain.hardware.devices import NONGEMM_CLASSES, get_device
from simtrain.workload.nongemm import KERNEL_CLASSES, family_bytes, kernels


def test_bytes_per_family_closed_form():
    E = 1_000_000
    # fused RMSNorm: read x, write y in 16-bit = 4 bytes/element; unfused: cast 6 + pow 8 + mean 4
    # + mul 8 + cast 6 + mul 4 = 36, in 6 kernels
    assert family_bytes("rmsnorm", E, "F", True) == 4 * E
    assert family_bytes("rmsnorm", E, "F", False) == 36 * E
    assert len(kernels("rmsnorm", "n", E, "F", False)) == 6
    # bias-GeLU: fused 2+2, unfused bias add 4 + gelu 4 = 8; backward fused dy, x -> dx = 6
    assert family_bytes("bias_gelu", E, "F", True) == 4 * E
    assert family_bytes("bias_gelu", E, "F", False) == 8 * E
    assert family_bytes("bias_gelu", E, "B", True) == 6 * E
    # bias-dropout-add fused: read x and residual, write out and a 1-byte mask = 7; unfused 4 + 5 + 6 = 15
    assert family_bytes("bias_dropout_add", E, "F", True) == 7 * E
    assert family_bytes("bias_dropout_add", E, "F", False) == 15 * E
    # cross-entropy on fp32 logits, unfused: cast 6, max 4, sub 8, exp 8, sum 4, div 8 = 38; fused 26
    assert family_bytes("cross_entropy", E, "F", False) == 38 * E
    assert family_bytes("cross_entropy", E, "F", True) == 26 * E
    assert family_bytes("cross_entropy", E, "B", False) == 14 * E


def test_kernel_classes_agree_and_presets_carry_curves():
    assert tuple(NONGEMM_CLASSES) == tuple(KERNEL_CLASSES)
    h = get_device("h100-sxm5-80gb")
    # Liger-Kernel H100 NVL rms_norm forward, H=32768, M=2048: 268435456 B in 0.110656 ms
    # -> 2.426 TB/s / 3938 GB/s = 0.616
    eff, inside = h.nongemm_curve("norm").at(268435456)
    assert inside and abs(eff - 0.616) < 1e-9
    assert get_device("h200-sxm-141gb").nongemm_curve("eager").origin == "h100-sxm5-80gb"
