"""Container images from registries, without Docker: references, the registry API, layers.

Backend-neutral: this package fetches and checks what a registry serves (manifests, image
configs, layer blobs, every one verified against its digest) and unpacks layers into directory
trees; a sandbox backend's image store (:mod:`sandrl.sandbox.bwrap.images`) keeps them and
mounts them. Nothing here imports a sandbox backend.
"""
