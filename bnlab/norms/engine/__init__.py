"""The engine the layers run on: :mod:`.route` picks how a step runs, :mod:`.step` runs it with
batch statistics (:mod:`.fused` operators or plain ops, :mod:`.kernels` for the full-size passes),
and :mod:`.switches` answers every question asked on the way; :mod:`.guard`, :mod:`.sync`,
:mod:`.coef_compile` and :mod:`.compiled_step` act where a switch turns them on."""
