"""Stage 4, drawing: hairline designs (`designs`), the grown-hair preview (`preview`,
`preview_texture`) and the annotated render (`render`). Reads a `Hairline` and a face;
imports only `face` and analysis' top-level shared modules.
"""
