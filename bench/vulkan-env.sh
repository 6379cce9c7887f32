# Sourced by the H200 scripts: unpacks the Vulkan loader and glvnd libraries carried in .gl/
# (see BENCHMARKS.md, "On the H200") and points wgpu at the NVIDIA Vulkan driver.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export WGPU_BACKEND=vulkan
# The GPU and the date for result files' names (h100-2026-12-07, ...), from the driver: a call
# may run on an H100 or an H200.
gpu_tag=$(nvidia-smi -L | head -1 | grep -o -E "[HAB][0-9]{2,3}" | head -1 | tr A-Z a-z)
gpu_tag="${gpu_tag:-gpu}-$(date -u +%Y-%m-%d)"
