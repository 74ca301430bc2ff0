--- lutra.dist.tp (lt.dist.tp): tensor parallelism as Megatron-LM splits a
-- transformer (Shoeybi et al. 2019; sequence parallelism: Korthikanti et
-- al. 2022). One table of:
--   regions.lua  the f / g operators and their sequence-parallel forms
--                (copy_to_region, reduce_from_region, gather_from_region,
--                scatter_to_region, gather_rows, reduce_scatter_rows,
--                scatter_rows, dropout_rows) and shard(), the slicing of a
--                whole tensor
--   records.lua  which parameters are shards (mark, plan, sharded, group)
--   linear.lua   ColumnParallelLinear, RowParallelLinear
--   vocab.lua    VocabParallelEmbedding, vocab_parallel_cross_entropy,
--                linear_cross_entropy (the vocabulary split across ranks)
--   state.lua    whole state dicts: full_state_dict (gathered),
--                load_full_state_dict (each rank its slice)
--   norm.lua     the global quantities: the gradient norm each parameter
--                counted once (split_squares, global_norm, grad_norm),
--                check_replicated, check_dp_group, check_same_batch
-- (ckpt.lua, the checkpoint files of a TP model, is lt.ckpt's, not re-exported.)
-- A group is a process group of lt.dist (lt.dist.mesh{tp = n}.tp, or
-- lt.dist.new_group); every rank of it calls the same functions in the
-- same order, as for any collective.
local M = {}

-- (each required at the top level: tests/lua/modules_spec.lua)
local regions, records = require "lutra.dist.tp.regions", require "lutra.dist.tp.records"
local linear, state = require "lutra.dist.tp.linear", require "lutra.dist.tp.state"
local vocab, norm = require "lutra.dist.tp.vocab", require "lutra.dist.tp.norm"
for _, part in ipairs { regions, records, linear, vocab, state, norm } do
  for k, v in pairs(part) do M[k] = v end
end

return M
