// One tile's online-softmax step of kernels/attention.wgsl (the split kernel's and the exact
// tokens' workgroup's), included inside their tile loops. Each invocation scored one token
// per row g (`sc$g`, attended where `ok$g`; capped here where the cache has a softcap); the row's running max `m$g` and sum `l$g` are
// in scope. Leaves `alpha$g` (the factor the row's output sums are rescaled by) and `pw$g`
// (the weight of this invocation's token), with m$g and l$g updated; the caller writes the
// weights. The tile max takes two steps: MXP invocations take 16 scores each, then every
// invocation reads the MXP maxima (a scan of every score by every invocation cost as much as
// the K phase), so every invocation derives the same max and m stays uniform.
#unroll $g GR
sc$g = capped(sc$g);
{{scores}}[$g * (WG / 4u) + lid / 4u][lid % 4u] = select(NEG, sc$g, ok$g);
workgroupBarrier();
if lid < MXP {
    let x$g = max(max({{scores}}[$g * (WG / 4u) + 4u * lid], {{scores}}[$g * (WG / 4u) + 4u * lid + 1u]), max({{scores}}[$g * (WG / 4u) + 4u * lid + 2u], {{scores}}[$g * (WG / 4u) + 4u * lid + 3u]));
    mx_sh[($g * MXP + lid) / 4u][lid % 4u] = max(max(x$g.x, x$g.y), max(x$g.z, x$g.w));
}
workgroupBarrier();
var mt$g = vec4<f32>(NEG);
for (var i = 0u; i < MXP / 4u; i++) {
    mt$g = max(mt$g, mx_sh[$g * (MXP / 4u) + i]);
}
let mn$g = max(m$g, max(max(mt$g.x, mt$g.y), max(mt$g.z, mt$g.w)));
let alpha$g = exp(m$g - mn$g);
m$g = mn$g;
let pw$g = select(0.0, exp(sc$g - mn$g), ok$g);
l$g = l$g * alpha$g + pw$g;
