// The softmax sum of each row g over the workgroup, at the end of kernels/attention.wgsl's
// split kernel and exact tokens' workgroup: every invocation holds the sum `l$g` of its own
// tokens' weights (all under the same max), MXP invocations add 16 of them each, then every
// invocation adds the MXP partial sums into l$g. {{scores}} and mx_sh must be free to write.
#unroll $g GR
{{scores}}[$g * (WG / 4u) + lid / 4u][lid % 4u] = l$g;
workgroupBarrier();
if lid < MXP {
    let y$g = {{scores}}[$g * (WG / 4u) + 4u * lid] + {{scores}}[$g * (WG / 4u) + 4u * lid + 1u] + {{scores}}[$g * (WG / 4u) + 4u * lid + 2u] + {{scores}}[$g * (WG / 4u) + 4u * lid + 3u];
    mx_sh[($g * MXP + lid) / 4u][lid % 4u] = y$g.x + y$g.y + y$g.z + y$g.w;
}
workgroupBarrier();
var lt$g = vec4<f32>(0.0);
for (var i = 0u; i < MXP / 4u; i++) {
    lt$g += mx_sh[$g * (MXP / 4u) + i];
}
l$g = lt$g.x + lt$g.y + lt$g.z + lt$g.w;
