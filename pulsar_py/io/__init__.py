"""File formats read and written by the command-line tools and examples: images and
animations (``images``, through imageio) and PLY point clouds and 3D Gaussian Splatting
scenes (``ply``, through plyfile). Those packages come with the ``tools`` extra and are
imported when a file is read or written; the renderer itself never imports this package."""
