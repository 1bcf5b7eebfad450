"""Files in: turning HTML, Markdown, plain text, PDF and JSONL files into documents with sections.

`scan` walks the paths given (refusing what lies outside them), one parser per format
(`parsers.parser_for`) reads a file into a `ParsedFile` of sections, and a `DocumentSource`
(`source.open_source`) yields the `Document`s the index builder chunks, listing each file it
could not read with the reason. Parsing is done by libraries (selectolax, markdown-it-py,
pypdfium2; docs/retrieval.md says why), never by hand.

May import: `retrieval.corpus`, `retrieval.errors`, `retrieval.jsonl`, the standard library and
those parsers. Nothing else of ours.
"""
