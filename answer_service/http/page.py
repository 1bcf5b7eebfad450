"""The search page: `GET /` (a page with no outside dependencies) asks `POST /v1/answer` from the
browser and shows the answer streaming with its citations, sources and stage times.

Its files live in `static/page/` and are served by the dashboard's static mount
(`/dashboard/static/page/`), whose helpers (`static/js/dom.js`, `format.js`) it reuses. The page
itself is open, like the dashboard; the API calls it makes carry the key the user enters.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from answer_service.http.dashboard import STATIC_DIR

router = APIRouter(include_in_schema=False)


@router.get("/")
async def search_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "page" / "index.html", headers={"Cache-Control": "no-cache"})
