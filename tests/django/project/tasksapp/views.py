"""Views of the test project: an async view that enqueues with ``aenqueue``."""

from django.http import HttpRequest, JsonResponse

from tasksapp import tasks


async def enqueue_async(request: HttpRequest) -> JsonResponse:
    result = await tasks.add.aenqueue(int(request.GET["a"]), int(request.GET["b"]))
    return JsonResponse({"id": result.id, "status": result.status})
