from rest_framework.routers import DefaultRouter

from governance.api.views import ModelViewSet

router = DefaultRouter()
router.register("models", ModelViewSet, basename="model")

urlpatterns = router.urls
