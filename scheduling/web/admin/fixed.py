"""Fixed-time schedules in the admin: django-celery-beat's periodic tasks with Timekeeper's policy inline.

A readable timing, the next runs, the run history and "run now", which goes through the same gate
as beat's ticks (``gate.run_now``). Also the runs' history and the schedulers' heartbeats (read-only).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext
from django_celery_beat import admin as beat_admin
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from scheduling.core import exceptions
from scheduling.fixed import edits
from scheduling.models import (
    RunState,
    SchedulePolicy,
    SchedulerHeartbeat,
    ScheduleRun,
)
from scheduling.templatetags.timekeeper_admin import relative
from scheduling.web import store
from scheduling.web.admin import common, fixed_forms

RECENT_RUNS_SHOWN = 10  # runs listed on a schedule's page (the full history is linked)
NEXT_RUNS_SHOWN = 5


class SchedulePolicyInline(admin.StackedInline):
    model = SchedulePolicy
    form = fixed_forms.SchedulePolicyForm
    formset = fixed_forms.PolicyFormSet
    extra = 1
    max_num = 1
    can_delete = False
    verbose_name = "fixed-time policy"
    verbose_name_plural = "fixed-time policy (runs through Timekeeper's exactly-once gate)"
    readonly_fields = ("anchor_at", "last_tick")
    fieldsets = fixed_forms.policy_fieldsets(readonly=readonly_fields)  # the policy spec's groups

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        """The policy form offers the kinds the person may use (every kind to a superuser)."""
        formset = super().get_formset(request, obj, **kwargs)
        return type(formset.__name__, (formset,), {"user": request.user})


class SuperuserTimingMixin:
    """django-celery-beat's timing rows (crontab, interval, solar, clocked) are shared by every task using them,
    and beat times a schedule from its row: only a superuser adds, changes or deletes one. Others set a
    schedule's timing through its policy's expression or interval, which the bounds check (``fixed.bounds``);
    they see the rows with the view permission itself (the change permission no longer implies it)."""

    model: Any

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return bool(request.user.is_superuser) and super().has_add_permission(request, *args)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_delete_permission(request, obj)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.is_superuser:
            return True
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}")


for _timing_model, _beat_admin in (
    (CrontabSchedule, beat_admin.CrontabScheduleAdmin),
    (IntervalSchedule, beat_admin.IntervalScheduleAdmin),
    (SolarSchedule, beat_admin.SolarScheduleAdmin),
    (ClockedSchedule, beat_admin.ClockedScheduleAdmin),
):
    admin.site.unregister(_timing_model)
    admin.site.register(
        _timing_model,
        type(_beat_admin.__name__, (SuperuserTimingMixin, _beat_admin), {"__module__": __name__}),
    )


admin.site.unregister(PeriodicTask)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(common.CheckedSelectionMixin, beat_admin.PeriodicTaskAdmin):
    """django-celery-beat's admin plus the policy, a readable timing, the next runs, history and "run now"."""

    inlines = (SchedulePolicyInline,)
    list_display = ("name", "enabled", "timing", "next_run", "last_run_state", "last_run_at")
    actions = ("enable_tasks", "disable_tasks", "toggle_tasks", "run_now_selected")
    change_form_template = "admin/scheduling/periodictask/change_form.html"
    fieldsets = (
        *beat_admin.PeriodicTaskAdmin.fieldsets[:2],
        ("Timekeeper", {"fields": ("timing", "next_runs", "recent_runs")}),
        *beat_admin.PeriodicTaskAdmin.fieldsets[2:],
    )
    readonly_fields = (*beat_admin.PeriodicTaskAdmin.readonly_fields, "timing", "next_runs", "recent_runs")

    # With a policy, its expression (or interval) is the schedule's one timing: these are written from it.
    BEAT_TIMING_FIELDS = frozenset({"interval", "crontab", "crontab_translation", "solar", "clocked"})

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """Everyone but a superuser may save only ``scheduling.run_fixed`` naming itself (``fixed_forms``)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        if not getattr(request.user, "is_superuser", False):
            form = fixed_forms.restrict_periodic_task_form(form, request.user)
        if obj is not None and self._declared_in_code(obj):
            form = fixed_forms.disable_fields(form, self.RAW_BEAT_FIELDS)
        return form

    # On a schedule declared in code, django-celery-beat's raw fields are sync's business, not an operator's:
    # the task is always scheduling.run_fixed with {"schedule": name}, and one-off, start time, arguments and
    # routing mean nothing to the gate. They are shown read-only (disabled: a post cannot change them).
    RAW_BEAT_FIELDS = frozenset(
        {"regtask", "task", "one_off", "start_time", "args", "kwargs", "expires", "expire_seconds", "queue",
         "exchange", "routing_key", "priority", "headers"}
    )  # fmt: skip

    def get_fieldsets(self, request: HttpRequest, obj: PeriodicTask | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not self._policy_exists(obj):
            return fieldsets
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f not in self.BEAT_TIMING_FIELDS)})
            for name, options in fieldsets
        ]

    @staticmethod
    def _declared_in_code(task: PeriodicTask) -> bool:
        """Whether a ``schedules.declare()`` names this schedule (``timekeeper sync`` then rewrites it)."""
        from scheduling.fixed import declarations

        return task.name in declarations.declared()

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        """The page, with a warning on a schedule declared in code: ``timekeeper sync`` overwrites edits of it."""
        context = dict(extra_context or {})
        task = self.get_object(request, object_id) if object_id else None
        context["declared_in_code"] = task is not None and self._declared_in_code(task)
        return super().changeform_view(request, object_id, form_url, context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[PeriodicTask]:
        last_state = ScheduleRun.objects.filter(schedule__periodic_task=OuterRef("pk")).order_by("-tick")
        return (
            super()
            .get_queryset(request)
            .select_related("policy")
            .annotate(last_run_state=Subquery(last_state.values("state")[:1]))
        )

    @staticmethod
    def _policy(task: PeriodicTask) -> SchedulePolicy | None:
        try:
            return task.policy  # type: ignore[attr-defined]
        except SchedulePolicy.DoesNotExist:
            return None

    @admin.display(description="timing")
    def timing(self, task: PeriodicTask) -> str:
        from scheduling.fixed import policies

        if task.pk is None:
            return "—"
        return policies.describe(task)

    @admin.display(description="next run")
    def next_run(self, task: PeriodicTask) -> str:
        runs = self._preview(task, 1)
        if isinstance(runs, str):
            return runs
        return f"{runs[0]:%Y-%m-%d %H:%M %Z}" if runs else "—"

    @admin.display(description="last run", ordering="last_run_state")
    def last_run_state(self, task: PeriodicTask) -> str:
        state = getattr(task, "last_run_state", None)
        return RunState(state).label if state else "—"

    def _preview(self, task: PeriodicTask, n: int) -> list[Any] | str:
        from scheduling.fixed import policies

        if task.pk is None or not task.enabled:
            return "disabled" if task.pk is not None else "—"
        policy = self._policy(task)
        if policy is not None and policy.suspend:
            return "suspended"
        try:
            return policies.preview(task, n=n)
        except exceptions.SchedulingError as exc:
            return f"invalid: {exc}"

    @admin.display(description=f"next {NEXT_RUNS_SHOWN} runs (in the schedule's zone)")
    def next_runs(self, task: PeriodicTask) -> str:
        runs = self._preview(task, NEXT_RUNS_SHOWN)
        if isinstance(runs, str):
            return runs
        if not runs:
            return "none"
        return format_html(
            '<ol class="tk-next-runs">{}</ol>',
            format_html_join(
                "",
                '<li>{} <span class="quiet">({})</span></li>',
                ((f"{tick:%a %Y-%m-%d %H:%M:%S %Z}", relative(tick)) for tick in runs),
            ),
        )

    @admin.display(description="recent runs")
    def recent_runs(self, task: PeriodicTask) -> str:
        policy = self._policy(task) if task.pk is not None else None
        if policy is None:
            return "not a fixed-time schedule (no policy)"
        runs = list(ScheduleRun.objects.filter(schedule=policy).order_by("-tick")[:RECENT_RUNS_SHOWN])
        link = reverse("admin:scheduling_schedulerun_changelist") + f"?schedule__id__exact={policy.pk}"
        if not runs:
            return format_html('no runs yet · <a href="{}">history</a>', link)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    f"{timezone.localtime(r.tick):%Y-%m-%d %H:%M:%S %Z}",
                    r.get_state_display(),
                    r.get_trigger_display(),
                    f"{(r.finished_at - r.started_at).total_seconds():.2f} s" if r.finished_at else "running",
                    (r.error[:120] if r.error else ""),
                )
                for r in runs
            ),
        )
        return format_html(
            '<table class="tk-runs"><thead><tr><th>tick</th><th>state</th><th>trigger</th><th>took</th>'
            '<th>error</th></tr></thead><tbody>{}</tbody></table><a href="{}">full history</a>',
            rows,
            link,
        )

    # -- saving goes through scheduling.fixed.edits (the two rows stay one schedule there)

    def save_model(self, request: HttpRequest, obj: PeriodicTask, form: Any, change: bool) -> None:
        edits.save_task(obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """The policy inline: Django builds the policy (``commit=False`` writes nothing); ``edits`` saves it."""
        formset.save(commit=False)  # also keeps Django's change message (new_objects, changed_objects)
        for policy_form in formset.forms:
            policy = policy_form.instance
            if not isinstance(policy_form, fixed_forms.SchedulePolicyForm):
                continue
            if policy.pk is None and not policy_form.has_changed():
                continue  # the empty extra form: no policy
            data = policy_form.cleaned_data
            edits.save_policy(
                form.instance,
                policy,
                changed=policy_form.has_changed(),
                timezone=data.get("timezone") or "UTC",
                every_seconds=data.get("every_seconds"),
            )

    # -- one pause switch: "Enabled"; a policy's suspend follows it (edits.enable, disable, toggle)

    @admin.action(description="Enable selected tasks")
    def enable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        switched = edits.enable(queryset.values_list("pk", flat=True))
        self.message_user(
            request,
            ngettext("%(count)d task was successfully enabled", "%(count)d tasks were successfully enabled", switched)
            % {"count": switched},
        )

    @admin.action(description="Disable selected tasks")
    def disable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        switched = edits.disable(queryset.values_list("pk", flat=True))
        self.message_user(
            request,
            ngettext("%(count)d task was successfully disabled", "%(count)d tasks were successfully disabled", switched)
            % {"count": switched},
        )

    @admin.action(description="Toggle activity of selected tasks")
    def toggle_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        switched = edits.toggle(queryset.values_list("pk", flat=True))
        self.message_user(
            request,
            ngettext("%(count)d task was successfully toggled", "%(count)d tasks were successfully toggled", switched)
            % {"count": switched},
        )

    @staticmethod
    def _policy_exists(task: PeriodicTask) -> bool:
        return SchedulePolicy.objects.filter(periodic_task=task).exists()

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        run_now = path(
            "<path:object_id>/run-now/",
            self.admin_site.admin_view(self.run_now_view),
            name="django_celery_beat_periodictask_run_now",
        )
        return [run_now, *urls]

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: send one manual run of this schedule through the gate."""
        task = self.get_object(request, object_id)
        if task is None or request.method != "POST" or not self.has_change_permission(request, task):
            raise PermissionDenied
        self._run_now(request, PeriodicTask.objects.filter(pk=task.pk))
        return HttpResponseRedirect(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))

    @admin.action(description="Run selected schedules now (through the exactly-once gate)", permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        self._run_now(request, queryset)

    def _run_now(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        from scheduling.fixed import gate

        sent, skipped = [], []
        for task in queryset.select_related("policy"):
            if self._policy(task) is None:
                skipped.append(task.name)
                continue
            try:
                gate.run_now(task)
            except exceptions.SchedulingError as exc:
                self.message_user(request, f"{task.name}: {exc}", messages.ERROR)
            else:
                sent.append(task.name)
        if sent:
            self.message_user(
                request,
                ngettext(
                    "Sent a manual run of %(names)s; it appears in the run history when a worker takes it.",
                    "Sent manual runs of %(count)d schedules (%(names)s); they appear in their run histories.",
                    len(sent),
                )
                % {"count": len(sent), "names": ", ".join(sent)},
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d periodic task was not run: %(names)s has no fixed-time policy.",
                    "%(count)d periodic tasks were not run: %(names)s have no fixed-time policy.",
                    len(skipped),
                )
                % {"count": len(skipped), "names": ", ".join(skipped)},
                messages.WARNING,
            )


@admin.register(ScheduleRun)
class ScheduleRunAdmin(admin.ModelAdmin):
    list_display = ("schedule_name", "tick", "state", "trigger", "attempt", "duration", "duplicates_refused", "worker")
    list_filter = ("state", "trigger", "schedule")
    list_select_related = ("schedule__periodic_task",)
    date_hierarchy = "tick"
    ordering = ("-tick",)
    search_fields = ("schedule__periodic_task__name", "task_id")
    actions = ("abort_selected",)

    @admin.action(description="Abort selected running runs", permissions=["abort"])
    def abort_selected(self, request: HttpRequest, queryset: QuerySet[ScheduleRun]) -> None:
        """Ask each running run's worker to stop it (``api.abort_schedule_run``); report the finished ones."""
        from scheduling import api

        asked, finished = [], []
        for run_id in queryset.values_list("pk", flat=True):
            try:
                api.abort_schedule_run(run_id)
            except exceptions.RunNotRunning:
                finished.append(run_id)
            else:
                asked.append(run_id)
        if asked:
            self.message_user(
                request,
                ngettext(
                    "Asked %(count)d running run to stop: its worker interrupts it within a heartbeat interval.",
                    "Asked %(count)d running runs to stop: their workers interrupt them within a heartbeat interval.",
                    len(asked),
                )
                % {"count": len(asked)},
                messages.SUCCESS,
            )
        if finished:
            self.message_user(
                request,
                ngettext(
                    "%(count)d run was not running (it had finished): left as it was.",
                    "%(count)d runs were not running (they had finished): left as they were.",
                    len(finished),
                )
                % {"count": len(finished)},
                messages.WARNING,
            )

    def has_abort_permission(self, request: HttpRequest) -> bool:
        """Aborting a run changes its schedule's work: the schedule's (periodic task's) change permission."""
        return request.user.has_perm("django_celery_beat.change_periodictask")

    @admin.display(description="schedule", ordering="schedule__periodic_task__name")
    def schedule_name(self, run: ScheduleRun) -> str:
        return run.schedule.periodic_task.name

    @admin.display(description="took")
    def duration(self, run: ScheduleRun) -> str:
        if run.finished_at is None:
            return "running"
        return f"{(run.finished_at - run.started_at).total_seconds():.2f} s"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the history is the ledger; the gate prunes it to the policy's limits


@admin.register(SchedulerHeartbeat)
class SchedulerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("role", "holder", "acquired_at", "heartbeat_at", "age")

    @admin.display(description="age (database clock)")
    def age(self, row: SchedulerHeartbeat) -> str:
        beat = store.beat_heartbeat(row.role)
        return f"{beat.age_seconds:.1f} s" if beat else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
