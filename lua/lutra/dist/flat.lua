--- lutra.dist.flat: the flat buffers ZeRO lays parameters out in, shared
-- by stages 1-2 (lutra.dist.zero) and stage 3 (lutra.dist.zero3).
local M = {}

--- flat_groups(params, wd[, size[, sharded[, copies]]]) -> flats: the parameters laid
-- end to end per weight-decay group (decay on dims >= 2, as lt.optim) and
-- dtype, each {params, offsets, numel, dtype, device, weight_decay}. With
-- sharded (a tensor-parallel model's lt.dist.tp.records.sharded table) the
-- shards and the replicated parameters never share a flat: the shards'
-- flats have tp_sharded = true (the gradient norm sums their squares over
-- the TP group, the others' once). With copies ({[param] = true}: a
-- pipeline's last stage's tied head, counted on the first stage) those
-- lie in flats of their own with pp_copy = true (left out of the norm).
-- Without size,
-- frozen parameters (requires_grad false) stay out: nothing updates them.
-- With size (ZeRO 3, which shards them all): frozen ones get flats of
-- their own (frozen = true), and every flat is padded to a multiple of
-- size (chunk = padded / size: equal chunks, as NCCL needs).
function M.flat_groups(params, wd, size, sharded, copies)
  local out, by = {}, {}
  for _, p in ipairs(params) do
    local frozen = not p.requires_grad
    if frozen and not size then goto continue end
    local decay = p:dim() >= 2
    local shard = sharded ~= nil and sharded[p] ~= nil
    local copy = copies ~= nil and copies[p] ~= nil
    local key = (decay and "d" or "n") .. p.dtype .. (frozen and "f" or "") .. (shard and "s" or "") .. (copy and "c" or "")
    if not by[key] then
      by[key] = { params = {}, offsets = {}, numel = 0, dtype = p.dtype, device = p.device,
        weight_decay = decay and wd or 0, frozen = frozen, tp_sharded = shard, pp_copy = copy }
      out[#out + 1] = by[key]
    end
    local g = by[key]
    g.params[#g.params + 1] = p
    g.offsets[#g.offsets + 1] = g.numel
    g.numel = g.numel + p:numel()
    ::continue::
  end
  for _, g in ipairs(size and out or {}) do
    g.chunk = math.ceil(g.numel / size)
    g.padded = g.chunk * size
  end
  return out
end

return M
