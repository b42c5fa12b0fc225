"""`Meshes`: the plan's device mesh, built once per process group.

The root mesh has every dimension of `interlock.engine.parallelism.DIMS` (size-1 ones
included, so that code can always name any of them), outermost first. The flattened
groups of `interlock.engine.parallelism.FLATTENED` are built with it and kept here:
torch deprecates reaching a flattened group through the root mesh, so
`Meshes.__getitem__` is the one way to name any group.

Two older names stay for parallelize functions written before the N-D mesh:
``data_parallel`` (dp_replicate x dp_shard) and ``tensor_parallel`` (tp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from interlock.engine.parallelism import DIMS, FLATTENED, MeshLayout

#: names of the mesh before it had five dimensions, and what they are now
OLDER_NAMES: dict[str, tuple[str, ...]] = {
    "data_parallel": ("dp_replicate", "dp_shard"),
    "tensor_parallel": ("tp",),
}


@dataclass(slots=True)
class Meshes:
    """The root device mesh and its flattened groups, by name."""

    root: DeviceMesh
    flattened: dict[str, DeviceMesh] = field(default_factory=dict)

    def __getitem__(self, name: str) -> DeviceMesh:
        """A dimension of the root mesh (``"tp"``) or a flattened group (``"dp"``)."""
        if name in self.flattened:
            return self.flattened[name]
        if name in DIMS:
            return self.root[name]
        known = (*DIMS, *self.flattened)
        raise KeyError(f"no mesh group named {name!r}; groups: {', '.join(known)}")


def build_meshes(device_type: str, layout: MeshLayout) -> Meshes:
    """Build the plan's mesh on the current process group (a collective: every rank
    calls it, in the same order)."""
    root = init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.dims)
    meshes = Meshes(root)
    for name, (dims, _role) in (*FLATTENED.items(),
                                *((k, (v, "")) for k, v in OLDER_NAMES.items())):
        meshes.flattened[name] = root[dims]._flatten(name)
    return meshes
