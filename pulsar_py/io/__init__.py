"""File formats read and written by the command-line tools and examples (images, point
clouds). The renderer itself never imports this package."""
