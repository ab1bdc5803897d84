"""project.error_reports: Django's error page shows no password, not even inside a URL."""
from __future__ import annotations

import sys

from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter

SECRET = "s3cret" + "pw"  # built, so the page's source context does not show it literally
DATABASE_URL = f"postgresql://app:{SECRET}@db.internal:5432/app"
BROKER_URL = f"redis://:{SECRET}@cache.internal:6379/0"


def connect(url: str, settings_dict: dict[str, str]) -> None:
    """Fail the way a database connection does, with the URL and a settings dict in the frame."""
    raise ConnectionError("could not connect")


def error_page(debug: bool) -> str:
    """The HTML of Django's error page for a failed connect, as a browser (DEBUG) or an e-mail would get it."""
    request = RequestFactory().get("/jobs/", CELERY_BROKER_URL=BROKER_URL, FLOWER_BASIC_AUTH=f"admin:{SECRET}")
    with override_settings(DEBUG=debug, DATABASE_URL=DATABASE_URL, CELERY_BROKER_URL=BROKER_URL):
        try:
            connect(DATABASE_URL, {"NAME": "app", "PASSWORD": SECRET})
        except ConnectionError:
            reporter = ExceptionReporter(request, *sys.exc_info())
            return reporter.get_traceback_html()
    raise AssertionError("connect() always raises")


def test_debug_error_page_shows_no_password() -> None:
    """With DEBUG on: settings, request META and the frames' variables show URLs with *** for the password."""
    page = error_page(debug=True)
    assert SECRET not in page
    assert "postgresql://app:***@db.internal:5432/app" in page  # the URL itself stays readable
    assert "redis://:***@cache.internal:6379/0" in page


def test_production_error_report_shows_no_password() -> None:
    """With DEBUG off (error e-mails to ADMINS): the same report hides the same passwords."""
    assert SECRET not in error_page(debug=False)


def test_lazy_translated_settings_are_shown_not_crashed_on():
    """A setting holding a lazy translation (django-axes' messages) is cleansed as text, with URL passwords hidden."""
    from django.utils.functional import SimpleLazyObject
    from django.utils.translation import gettext_lazy

    from project import error_reports

    reporter_filter = error_reports.ExceptionReporterFilter()
    for lazy in (gettext_lazy(f"see {DATABASE_URL}"), SimpleLazyObject(lambda: f"see {DATABASE_URL}")):
        cleansed = reporter_filter.cleanse_setting("AXES_COOLOFF_MESSAGE", lazy)
        assert SECRET not in cleansed
        assert "db.internal" in cleansed
